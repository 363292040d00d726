//! [`MemBlocks`]: a [`Blocks`] store in host memory, for tests of the front ends (and the
//! server's stand-in where no engine store is wanted). Areas of 64 KiB are allocated on their
//! first write and freed when a discard covers them whole, so a large device costs only what
//! was written. It is not a swap device's store: its bytes live in host RAM.

use crate::{Blocks, SwapError};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

const AREA: u64 = 64 << 10;

/// A sparse in-memory block store; see the module's documentation.
pub struct MemBlocks {
    size: u64,
    areas: Vec<Mutex<Option<Box<[u8]>>>>,
    present: AtomicU64,
    /// Requests touching this byte range fail with an engine error (EIO), for tests.
    failing: Mutex<Option<Range<u64>>>,
}

impl MemBlocks {
    /// A store of `size` bytes, all reading as zeros.
    pub fn new(size: u64) -> Self {
        let areas = size.div_ceil(AREA) as usize;
        MemBlocks {
            size,
            areas: (0..areas).map(|_| Mutex::new(None)).collect(),
            present: AtomicU64::new(0),
            failing: Mutex::new(None),
        }
    }

    /// Bytes held: the areas written and not discarded since, whole.
    pub fn present_bytes(&self) -> u64 {
        self.present.load(Ordering::Relaxed)
    }

    /// From now on, requests that touch `range` fail with an engine error (`EIO`); `None`
    /// heals the store. What was stored there is kept.
    pub fn fail(&self, range: Option<Range<u64>>) {
        *self.failing.lock().unwrap() = range;
    }

    fn check(&self, call: &'static str, offset: u64, len: u64) -> Result<(), SwapError> {
        if offset.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(SwapError::OutOfRange { call, offset, len, size: self.size });
        }
        if let Some(range) = &*self.failing.lock().unwrap() {
            if offset < range.end && range.start < offset + len {
                let detail = format!("injected failure at {offset}+{len}");
                return Err(SwapError::Engine { call, source: tiermem::Error::OutOfMemory { call, detail } });
            }
        }
        Ok(())
    }

    /// Calls `each(area, range within the area, range within the request)` for every area
    /// that `offset..offset+len` touches.
    fn split(offset: u64, len: u64, mut each: impl FnMut(usize, Range<usize>, Range<usize>)) {
        let mut at = offset;
        while at < offset + len {
            let area = at / AREA;
            let start = (at % AREA) as usize;
            let end = ((offset + len).min((area + 1) * AREA) - area * AREA) as usize;
            let done = (at - offset) as usize;
            each(area as usize, start..end, done..done + (end - start));
            at = (area + 1) * AREA;
        }
    }
}

impl Blocks for MemBlocks {
    fn size(&self) -> u64 {
        self.size
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), SwapError> {
        self.check("read", offset, out.len() as u64)?;
        Self::split(offset, out.len() as u64, |area, inside, mine| match &*self.areas[area].lock().unwrap() {
            Some(bytes) => out[mine].copy_from_slice(&bytes[inside]),
            None => out[mine].fill(0),
        });
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), SwapError> {
        self.check("write", offset, data.len() as u64)?;
        Self::split(offset, data.len() as u64, |area, inside, mine| {
            let mut slot = self.areas[area].lock().unwrap();
            let bytes = slot.get_or_insert_with(|| {
                self.present.fetch_add(AREA, Ordering::Relaxed);
                vec![0; AREA as usize].into_boxed_slice()
            });
            bytes[inside].copy_from_slice(&data[mine]);
        });
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> Result<(), SwapError> {
        self.check("discard", offset, len)?;
        Self::split(offset, len, |area, inside, _| {
            let mut slot = self.areas[area].lock().unwrap();
            let whole =
                inside.start == 0 && (inside.end as u64 == AREA || area as u64 * AREA + inside.end as u64 == self.size);
            if whole {
                if slot.take().is_some() {
                    self.present.fetch_sub(AREA, Ordering::Relaxed);
                }
            } else if let Some(bytes) = slot.as_mut() {
                bytes[inside].fill(0);
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_was_written_and_zeros_after_discard() {
        let store = MemBlocks::new(3 * AREA + 100);
        let data: Vec<u8> = (0..AREA + 300).map(|i| (i * 7 + 1) as u8).collect();
        store.write(AREA - 150, &data).unwrap();
        assert_eq!(store.present_bytes(), 3 * AREA);
        let mut back = vec![0; data.len()];
        store.read(AREA - 150, &mut back).unwrap();
        assert_eq!(back, data);
        store.discard(AREA, AREA).unwrap();
        assert_eq!(store.present_bytes(), 2 * AREA);
        store.read(AREA - 150, &mut back).unwrap();
        assert_eq!(&back[..150], &data[..150]);
        assert!(back[150..150 + AREA as usize].iter().all(|&b| b == 0));
        assert_eq!(&back[150 + AREA as usize..], &data[150 + AREA as usize..]);
        // The last, short area is freed by a discard up to the end.
        store.write(3 * AREA, &[9; 100]).unwrap();
        store.discard(3 * AREA, 100).unwrap();
        assert_eq!(store.present_bytes(), 2 * AREA);
    }

    #[test]
    fn out_of_range_and_injected_failures() {
        let store = MemBlocks::new(AREA);
        let err = store.read(AREA - 1, &mut [0; 2]).unwrap_err();
        assert_eq!(err.errno(), libc::EINVAL);
        store.fail(Some(100..200));
        assert_eq!(store.write(150, &[1]).unwrap_err().errno(), libc::EIO);
        store.write(200, &[1]).unwrap();
        store.fail(None);
        store.write(150, &[1]).unwrap();
    }
}
