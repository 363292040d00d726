//! The pool of physical HBM chunks. `cuMemCreate` costs ~11 µs a chunk, so chunks are created
//! on first need up to the HBM cap and then reused. The cap is the engine's HBM *budget*: it
//! may shrink or grow while the engine runs (calls.rs, "The HBM budget"); chunks beyond a shrunk budget are
//! released as they become idle, and none is handed out while the budget is exceeded.

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

    /// Chunks made and idle: to be had without a driver call.
    pub fn idle(&self) -> usize {
        self.idle.len()
    }

    /// Chunks that can be had without evicting anything.
    pub fn available(&self) -> usize {
        self.cap.saturating_sub(self.in_use())
    }

    /// Chunks in use beyond the budget (after it shrank): to be sent down.
    pub fn excess(&self) -> usize {
        self.in_use().saturating_sub(self.cap)
    }

    /// Changes the budget to `cap` chunks; what is in use is untouched.
    pub fn set_cap(&mut self, cap: usize) {
        self.cap = cap;
    }

    /// Idle chunks to release now: those beyond `limit` chunks created.
    pub fn releasable(&self, limit: usize) -> usize {
        self.idle.len().min(self.created.saturating_sub(limit))
    }

    /// Takes `n` idle chunks out of the pool, to be released with [`ChunkPool::release`].
    pub fn take_idle(&mut self, n: usize) -> Vec<PhysHandle> {
        let keep = self.idle.len() - n.min(self.idle.len());
        self.idle.split_off(keep)
    }

    /// Gives a chunk taken by [`ChunkPool::take_idle`] back to the driver.
    pub fn release(&mut self, device: &dyn Device, chunk: PhysHandle) -> Result<()> {
        device.release_chunk(chunk)?;
        self.created -= 1;
        Ok(())
    }

    /// An idle chunk, or a new one while under the cap. `None` when the cap is reached or the
    /// driver is out of memory (the cap then shrinks to what the driver gave: the rest of the
    /// GPU is in use by others).
    pub fn take(&mut self, device: &dyn Device) -> Result<Option<PhysHandle>> {
        if self.in_use() >= self.cap {
            return Ok(None);
        }
        if let Some(chunk) = self.idle.pop() {
            return Ok(Some(chunk));
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
        if self.in_use() >= self.cap {
            return false;
        }
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

    /// Releases every idle chunk; the engine calls this once all chunks are back.
    pub fn release_all(&mut self, device: &dyn Device) -> Result<()> {
        while let Some(chunk) = self.idle.pop() {
            self.created -= 1;
            device.release_chunk(chunk)?;
        }
        Ok(())
    }
}
