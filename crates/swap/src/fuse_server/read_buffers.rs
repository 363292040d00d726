//! The read buffers of the FUSE server: page-aligned, allocated when it starts (one per server
//! thread and a few spare), so that a read allocates nothing.

use std::sync::Mutex;

/// Page-aligned read buffers, allocated up front. A buffer is a `Vec` one page longer than
/// needed, used from its first page boundary.
pub(super) struct Buffers {
    free: Mutex<Vec<Vec<u8>>>,
    len: usize,
}

pub(super) const PAGE: usize = 4096;

impl Buffers {
    pub(super) fn new(count: usize, len: usize) -> Self {
        Buffers { free: Mutex::new((0..count).map(|_| vec![0u8; len + PAGE]).collect()), len }
    }

    /// A buffer of at least `len` bytes; `None` from the pool means it was allocated.
    pub(super) fn take(&self, len: usize) -> (Vec<u8>, bool) {
        if len <= self.len {
            if let Some(buffer) = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop() {
                return (buffer, true);
            }
        }
        (vec![0u8; len.max(self.len) + PAGE], false)
    }

    pub(super) fn give(&self, buffer: Vec<u8>) {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).push(buffer);
    }

    pub(super) fn aligned(buffer: &mut [u8], len: usize) -> &mut [u8] {
        let skip = buffer.as_ptr().align_offset(PAGE).min(PAGE);
        &mut buffer[skip..skip + len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_page_aligned() {
        let pool = Buffers::new(1, 3 * PAGE);
        let (mut b, pooled) = pool.take(3 * PAGE);
        assert!(pooled);
        assert_eq!(Buffers::aligned(&mut b, 3 * PAGE).as_ptr() as usize % PAGE, 0);
        let (_, pooled) = pool.take(PAGE);
        assert!(!pooled, "the pool had one buffer");
        pool.give(b);
        assert!(!pool.take(4 * PAGE).1, "larger than the pool's buffers");
    }
}
