//! The pool of physical HBM chunks. `cuMemCreate` costs ~11 µs a chunk, so chunks are created
//! on first need up to the HBM cap and then reused; they are released only when the engine
//! is dropped.

use tiermem_mechanism::{Device, DeviceError, PhysHandle, Result};

pub(crate) struct ChunkPool {
    idle: Vec<PhysHandle>,
    created: usize,
    cap: usize,
}

impl ChunkPool {
    pub fn new(cap_chunks: usize) -> Self {
        Self { idle: Vec::new(), created: 0, cap: cap_chunks }
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Chunks holding data (created and not idle).
    pub fn in_use(&self) -> usize {
        self.created - self.idle.len()
    }

    /// Chunks that can be had without evicting anything.
    pub fn available(&self) -> usize {
        self.cap - self.in_use()
    }

    /// An idle chunk, or a new one while under the cap. `None` when the cap is reached or the
    /// driver is out of memory (the cap then shrinks to what the driver gave: the rest of the
    /// GPU is in use by others).
    pub fn take(&mut self, device: &dyn Device) -> Result<Option<PhysHandle>> {
        if let Some(chunk) = self.idle.pop() {
            return Ok(Some(chunk));
        }
        if self.created >= self.cap {
            return Ok(None);
        }
        match device.create_chunk() {
            Ok(chunk) => {
                self.created += 1;
                Ok(Some(chunk))
            }
            Err(DeviceError::OutOfMemory { .. }) => {
                self.cap = self.created;
                Ok(None)
            }
            Err(other) => Err(other),
        }
    }

    /// Takes `chunk` itself if it is idle (a chunk coming back to the physical chunk its stale
    /// mapping still points at).
    pub fn take_exact(&mut self, chunk: PhysHandle) -> bool {
        match self.idle.iter().rposition(|&c| c == chunk) {
            Some(i) => {
                self.idle.swap_remove(i);
                true
            }
            None => false,
        }
    }

    pub fn give(&mut self, chunk: PhysHandle) {
        self.idle.push(chunk);
    }

    /// Releases the idle chunks (no mapping may use them any more) and returns how many; the
    /// pool creates chunks again on later need, up to the cap.
    pub fn release_idle(&mut self, device: &dyn Device) -> Result<usize> {
        let idle = self.idle.len();
        self.release_all(device)?;
        Ok(idle)
    }

    /// Releases every idle chunk; the engine calls this once all chunks are back.
    pub fn release_all(&mut self, device: &dyn Device) -> Result<()> {
        while let Some(chunk) = self.idle.pop() {
            self.created -= 1;
            device.release_chunk(chunk)?;
        }
        Ok(())
    }
}
