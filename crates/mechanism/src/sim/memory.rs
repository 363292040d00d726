//! The simulated node's physical memory: one sparse memfd per location — the HBM of each
//! simulated GPU, of fixed capacity, and pinned host memory, which grows as chunks are made.
//! A chunk is one granule of its location's memfd.
//!
//! A [`PhysHandle`] says where its chunk is: the location in the high 32 bits (the GPU's
//! ordinal, or [`HOST`]) and the granule within that memfd in the low 32. So on GPU 0 a
//! handle is just the granule's index, as it was when the simulated device had one GPU.
//!
//! Freshly created chunks are filled with [`POISON`], because `cuMemCreate` does not zero
//! memory either; released chunks give their memory back (a hole punched in the memfd).

use super::{POISON, SIM_GRANULARITY};
use crate::{ChunkLocation, DeviceError, PhysHandle, Result};
use std::collections::HashSet;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The location index of host memory in a handle's high bits.
const HOST: u64 = 0xFFFF;

/// One location's memory: a memfd and which of its granules hold live chunks.
struct Pool {
    memfd: OwnedFd,
    /// `None` for host memory, which grows with the chunks made there.
    capacity: Option<usize>,
    live: HashSet<u64>,
    free: Vec<u64>,
    next: u64,
}

impl Pool {
    fn new(name: &std::ffi::CStr, capacity: Option<usize>) -> Result<Self> {
        // SAFETY: memfd_create takes a NUL-terminated name and flags; it returns a new fd or -1.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(DeviceError::os("memfd_create"));
        }
        // SAFETY: fd was just returned by memfd_create and is owned by nobody else.
        let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
        let pool = Self { memfd, capacity, live: HashSet::new(), free: Vec::new(), next: 0 };
        pool.grow_to(capacity.unwrap_or(0))?;
        Ok(pool)
    }

    /// Makes the memfd `chunks` granules long; it stays sparse until written.
    fn grow_to(&self, chunks: usize) -> Result<()> {
        let size = (chunks * SIM_GRANULARITY) as libc::off_t;
        // SAFETY: plain syscall on an fd we own.
        if unsafe { libc::ftruncate(self.memfd.as_raw_fd(), size) } != 0 {
            return Err(DeviceError::os("ftruncate"));
        }
        Ok(())
    }
}

/// The physical memory of every location of a simulated node.
pub(super) struct Memory {
    /// Index = GPU ordinal.
    gpus: Vec<Pool>,
    host: Pool,
}

impl Memory {
    /// `gpus` GPUs of `capacity_chunks` chunks each, and host memory.
    pub fn new(gpus: usize, capacity_chunks: usize) -> Result<Self> {
        let gpus = (0..gpus).map(|_| Pool::new(c"tiermem-sim-hbm", Some(capacity_chunks))).collect::<Result<_>>()?;
        Ok(Self { gpus, host: Pool::new(c"tiermem-sim-host", None)? })
    }

    /// Creates a chunk at `location`, filled with poison.
    pub fn create(&mut self, location: ChunkLocation) -> Result<PhysHandle> {
        let (index, pool) = match location {
            ChunkLocation::Gpu(ordinal) => {
                let gpus = self.gpus.len();
                let pool = self.gpus.get_mut(ordinal).ok_or_else(|| DeviceError::Driver {
                    call: "cuMemCreate",
                    code: "CUDA_ERROR_INVALID_DEVICE".into(),
                    detail: format!("location GPU {ordinal}, but the simulated node has {gpus} GPU(s)"),
                })?;
                (ordinal as u64, pool)
            }
            ChunkLocation::Host => (HOST, &mut self.host),
        };
        if pool.capacity.is_some_and(|capacity| pool.live.len() >= capacity) {
            return Err(DeviceError::OutOfMemory {
                call: "cuMemCreate",
                detail: format!("all {} simulated chunks of {location} are in use", pool.live.len()),
            });
        }
        let slot = match pool.free.pop() {
            Some(slot) => slot,
            None => {
                if pool.capacity.is_none() {
                    pool.grow_to(pool.next as usize + 1)?;
                }
                pool.next += 1;
                pool.next - 1
            }
        };
        let poison = vec![POISON; SIM_GRANULARITY];
        let offset = (slot as usize * SIM_GRANULARITY) as libc::off_t;
        // SAFETY: writes our own buffer into our own memfd, inside its size.
        let n = unsafe { libc::pwrite(pool.memfd.as_raw_fd(), poison.as_ptr().cast(), poison.len(), offset) };
        if n != poison.len() as isize {
            pool.free.push(slot);
            return Err(DeviceError::os("pwrite"));
        }
        pool.live.insert(slot);
        Ok(PhysHandle(index << 32 | slot))
    }

    fn pool(&self, chunk: PhysHandle) -> Option<&Pool> {
        match chunk.0 >> 32 {
            HOST => Some(&self.host),
            gpu => self.gpus.get(gpu as usize),
        }
    }

    pub fn is_live(&self, chunk: PhysHandle) -> bool {
        self.pool(chunk).is_some_and(|pool| pool.live.contains(&(chunk.0 & 0xFFFF_FFFF)))
    }

    /// Where a live chunk is.
    pub fn location(chunk: PhysHandle) -> ChunkLocation {
        match chunk.0 >> 32 {
            HOST => ChunkLocation::Host,
            gpu => ChunkLocation::Gpu(gpu as usize),
        }
    }

    /// The memfd and offset of a live chunk's memory, to map it.
    pub fn backing(&self, chunk: PhysHandle) -> Option<(RawFd, libc::off_t)> {
        let pool = self.pool(chunk).filter(|_| self.is_live(chunk))?;
        Some((pool.memfd.as_raw_fd(), ((chunk.0 & 0xFFFF_FFFF) as usize * SIM_GRANULARITY) as libc::off_t))
    }

    /// Releases a live chunk (the caller checked it is live and mapped nowhere).
    pub fn release(&mut self, chunk: PhysHandle) {
        let slot = chunk.0 & 0xFFFF_FFFF;
        let pool = match chunk.0 >> 32 {
            HOST => &mut self.host,
            gpu => &mut self.gpus[gpu as usize],
        };
        // SAFETY: punching a hole in our own memfd frees the chunk's memory; no mapping refers to it.
        unsafe {
            libc::fallocate(
                pool.memfd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                (slot as usize * SIM_GRANULARITY) as libc::off_t,
                SIM_GRANULARITY as libc::off_t,
            )
        };
        pool.live.remove(&slot);
        pool.free.push(slot);
    }

    /// Live chunks on GPU `ordinal`.
    pub fn used(&self, ordinal: usize) -> usize {
        self.gpus[ordinal].live.len()
    }

    /// Live chunks everywhere.
    pub fn live(&self) -> usize {
        self.gpus.iter().chain(std::iter::once(&self.host)).map(|pool| pool.live.len()).sum()
    }
}
