//! The simulated node's physical memory: one sparse memfd per location — the HBM of each
//! simulated GPU, of fixed capacity, and pinned host memory, which grows as chunks are made.
//! A chunk is one granule of its location's memfd. Shareable allocations, which other
//! processes may import, each have a memfd of their own ([`super::shareable`]), counted against
//! the capacity of the GPU they were made on.
//!
//! A [`PhysHandle`] says where its chunk is: the location in the high 32 bits (the GPU's
//! ordinal, or [`HOST`]) and the granule within that memfd in the low 32. So on GPU 0 a
//! handle is just the granule's index, as it was when the simulated device had one GPU. A
//! shareable allocation's handle, made here or imported, has [`SHARED`] in the high bits and
//! its number in the low 32 (numbers are never reused, so a released handle stays dead).
//!
//! Freshly created chunks are filled with [`POISON`], because `cuMemCreate` does not zero
//! memory either; released chunks give their memory back (a hole punched in the memfd).

use super::shareable::SharedFile;
use super::{POISON, SIM_GRANULARITY};
use crate::{ChunkLocation, DeviceError, PhysHandle, Result};
use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// The location index of host memory in a handle's high bits.
const HOST: u64 = 0xFFFF;
/// The high bits of a shareable allocation's handle (made here or imported).
const SHARED: u64 = 0xFFFE;

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
    /// Shareable allocations this node holds a handle of, by number.
    shared: HashMap<u64, SharedFile>,
    next_shared: u64,
}

impl Memory {
    /// `gpus` GPUs of `capacity_chunks` chunks each, and host memory.
    pub fn new(gpus: usize, capacity_chunks: usize) -> Result<Self> {
        let gpus = (0..gpus).map(|_| Pool::new(c"tiermem-sim-hbm", Some(capacity_chunks))).collect::<Result<_>>()?;
        Ok(Self { gpus, host: Pool::new(c"tiermem-sim-host", None)?, shared: HashMap::new(), next_shared: 0 })
    }

    /// Refuses `granules` more granules at `location` if it is no location of the node, or a
    /// GPU without that much free capacity.
    fn check_room(&self, location: ChunkLocation, granules: usize) -> Result<()> {
        let ChunkLocation::Gpu(ordinal) = location else { return Ok(()) };
        let Some(capacity) = self.gpus.get(ordinal).and_then(|pool| pool.capacity) else {
            return Err(DeviceError::Driver {
                call: "cuMemCreate",
                code: "CUDA_ERROR_INVALID_DEVICE".into(),
                detail: format!("location GPU {ordinal}, but the simulated node has {} GPU(s)", self.gpus.len()),
            });
        };
        let used = self.used(ordinal);
        if used + granules > capacity {
            return Err(DeviceError::OutOfMemory {
                call: "cuMemCreate",
                detail: format!(
                    "{granules} granule(s) asked of {location}, {used} of its {capacity} simulated chunks in use"
                ),
            });
        }
        Ok(())
    }

    /// Creates a chunk at `location`, filled with poison.
    pub fn create(&mut self, location: ChunkLocation) -> Result<PhysHandle> {
        self.check_room(location, 1)?;
        let (index, pool) = match location {
            ChunkLocation::Gpu(ordinal) => (ordinal as u64, &mut self.gpus[ordinal]),
            ChunkLocation::Host => (HOST, &mut self.host),
        };
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

    /// Creates a shareable allocation of `granules` granules at `location`, filled with poison.
    pub fn create_shareable(&mut self, location: ChunkLocation, granules: usize) -> Result<PhysHandle> {
        if granules == 0 {
            return Err(DeviceError::Driver {
                call: "cuMemCreate",
                code: "CUDA_ERROR_INVALID_VALUE".into(),
                detail: format!("a shareable allocation of 0 granules at {location}"),
            });
        }
        self.check_room(location, granules)?;
        let file = SharedFile::create(location, granules)?;
        Ok(self.hold(file))
    }

    /// A handle of this node to the shareable allocation behind `fd`, `size` bytes long.
    pub fn import(&mut self, fd: BorrowedFd<'_>, size: usize) -> Result<PhysHandle> {
        let file = SharedFile::import(fd, size)?;
        Ok(self.hold(file))
    }

    fn hold(&mut self, file: SharedFile) -> PhysHandle {
        self.next_shared += 1;
        self.shared.insert(self.next_shared, file);
        PhysHandle(SHARED << 32 | self.next_shared)
    }

    /// A descriptor of a live shareable allocation, for another process.
    pub fn export(&self, chunk: PhysHandle) -> Result<OwnedFd> {
        match self.shared_file(chunk) {
            Some(file) => file.export(),
            None => Err(DeviceError::Driver {
                call: "cuMemExportToShareableHandle",
                code: "CUDA_ERROR_INVALID_VALUE".into(),
                detail: format!(
                    "handle 0x{:x} is no live shareable allocation (from create_shareable_chunks_at or import_chunk)",
                    chunk.0
                ),
            }),
        }
    }

    fn shared_file(&self, chunk: PhysHandle) -> Option<&SharedFile> {
        (chunk.0 >> 32 == SHARED).then(|| self.shared.get(&(chunk.0 & 0xFFFF_FFFF))).flatten()
    }

    /// How many granules a live shareable allocation has (`None` for anything else).
    pub fn shared_granules(&self, chunk: PhysHandle) -> Option<usize> {
        self.shared_file(chunk).map(|file| file.granules)
    }

    fn pool(&self, chunk: PhysHandle) -> Option<&Pool> {
        match chunk.0 >> 32 {
            HOST => Some(&self.host),
            SHARED => None,
            gpu => self.gpus.get(gpu as usize),
        }
    }

    pub fn is_live(&self, chunk: PhysHandle) -> bool {
        self.shared_file(chunk).is_some()
            || self.pool(chunk).is_some_and(|pool| pool.live.contains(&(chunk.0 & 0xFFFF_FFFF)))
    }

    /// Where a live chunk is; `None` for an imported allocation, whose memory is some GPU's of
    /// the node (see [`SharedFile::made_at`]).
    pub fn location(&self, chunk: PhysHandle) -> Option<ChunkLocation> {
        match chunk.0 >> 32 {
            HOST => Some(ChunkLocation::Host),
            SHARED => self.shared_file(chunk).and_then(|file| file.made_at),
            gpu => Some(ChunkLocation::Gpu(gpu as usize)),
        }
    }

    /// The memfd and offset of granule `granule` of a live chunk's memory, to map it: granule 0
    /// of a pool chunk, any granule of a shareable allocation.
    pub fn backing(&self, chunk: PhysHandle, granule: usize) -> Option<(RawFd, libc::off_t)> {
        if let Some(file) = self.shared_file(chunk) {
            let offset = (granule * SIM_GRANULARITY) as libc::off_t;
            return (granule < file.granules).then_some((file.raw_fd(), offset));
        }
        let pool = self.pool(chunk).filter(|_| granule == 0 && self.is_live(chunk))?;
        Some((pool.memfd.as_raw_fd(), ((chunk.0 & 0xFFFF_FFFF) as usize * SIM_GRANULARITY) as libc::off_t))
    }

    /// Releases a live chunk (the caller checked it is live and mapped nowhere). A shareable
    /// allocation's memfd is closed: its memory lives on while another handle, here or in
    /// another process, still has the file.
    pub fn release(&mut self, chunk: PhysHandle) {
        let slot = chunk.0 & 0xFFFF_FFFF;
        let pool = match chunk.0 >> 32 {
            SHARED => {
                self.shared.remove(&slot);
                return;
            }
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

    /// Live granules made on GPU `ordinal`: chunks and shareable allocations (not imports).
    pub fn used(&self, ordinal: usize) -> usize {
        let on_gpu = self.shared.values().filter(|file| file.made_at == Some(ChunkLocation::Gpu(ordinal)));
        self.gpus[ordinal].live.len() + on_gpu.map(|file| file.granules).sum::<usize>()
    }

    /// Live granules everywhere, of every handle (imports included).
    pub fn live(&self) -> usize {
        let pools = self.gpus.iter().chain(std::iter::once(&self.host)).map(|pool| pool.live.len());
        pools.sum::<usize>() + self.shared.values().map(|file| file.granules).sum::<usize>()
    }
}
