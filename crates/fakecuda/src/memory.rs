//! The fake driver's memory, as `crates/mechanism/src/sim` does it: device pointers are host
//! addresses. A reservation is `mmap(PROT_NONE)`; a physical chunk is a memfd of its size; a
//! mapping is `mmap(MAP_FIXED | MAP_SHARED)` of that memfd into a reservation, inaccessible
//! until `cuMemSetAccess` makes it read-write; an unmapping puts `PROT_NONE` pages back.
//! Plain allocations (`cuMemAlloc_v2` and friends) are anonymous read-write mappings. Chunks on
//! a GPU count against that GPU's memory, plain allocations against the memory of the GPU whose
//! context made them; host chunks count against nothing. Every fake GPU has the same size.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::{Code, CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY};

/// A range of addresses: its start and bytes.
pub type Span = (u64, usize);

/// The fake's granularity, for chunks on the GPU and on the host.
pub const GRANULARITY: usize = 2 << 20;

/// Where a chunk's memory is: on a GPU (its ordinal) or on the host. An imported chunk is the
/// host's here: its memory is counted by the process that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    Gpu(usize),
    Host,
}

struct Chunk {
    memfd: OwnedFd,
    size: usize,
    place: Place,
    /// Made with `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`: it may be exported.
    shareable: bool,
}

struct Mapping {
    size: usize,
    accessible: bool,
    handle: u64,
}

/// A plain allocation: its bytes, the GPU whose memory it takes and the context it was made in.
struct Plain {
    size: usize,
    gpu: usize,
    ctx: usize,
}

/// Everything the fake driver holds. Not thread-safe by itself (lib.rs locks it).
pub struct Memory {
    /// The bytes of each GPU's memory (the GPUs are alike).
    pub total: usize,
    /// The bytes in use on each GPU, by ordinal; as many entries as the fake has GPUs.
    used: Vec<usize>,
    /// The most of GPU 0's memory held at once.
    peak: usize,
    chunks: BTreeMap<u64, Chunk>,
    next_handle: u64,
    reservations: BTreeMap<u64, usize>,
    mappings: BTreeMap<u64, Mapping>,
    plain: BTreeMap<u64, Plain>,
}

/// What the fake holds now, for tests' leak checks (`tiermem_fake_census`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Census {
    pub gpu_chunks: usize,
    pub host_chunks: usize,
    pub reservations: usize,
    pub mappings: usize,
    pub plain: usize,
    pub used_bytes: usize,
    /// `cuCtxSynchronize` calls so far, `cuStreamSynchronize(_ptsz)` calls, and the stream
    /// handle the last of those was given.
    pub context_syncs: usize,
    pub stream_syncs: usize,
    pub last_synced_stream: usize,
    /// The most of GPU 0's memory (chunks and plain allocations) held at once so far.
    pub peak_used_bytes: usize,
    /// Chunks alive on GPU 1 (`TIERMEM_FAKE_GPUS=2`), the neighbour of GPU 0, and the bytes of
    /// GPU 1's memory in use. `gpu_chunks` and `used_bytes` are GPU 0's alone.
    pub neighbour_chunks: usize,
    pub neighbour_used_bytes: usize,
}

fn anonymous(at: *mut libc::c_void, size: usize, prot: i32, fixed: bool) -> Result<u64, Code> {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | if fixed { libc::MAP_FIXED } else { 0 };
    // SAFETY: an anonymous mapping; with MAP_FIXED, `at` is inside a range this fake owns.
    let p = unsafe { libc::mmap(at, size, prot, flags, -1, 0) };
    if p == libc::MAP_FAILED {
        Err(CUDA_ERROR_OUT_OF_MEMORY)
    } else {
        Ok(p as u64)
    }
}

impl Memory {
    /// The memory of `gpus` GPUs (at least one) of `total` bytes each.
    pub fn new(total: usize, gpus: usize) -> Self {
        Memory {
            total,
            used: vec![0; gpus.max(1)],
            peak: 0,
            chunks: BTreeMap::new(),
            next_handle: 1,
            reservations: BTreeMap::new(),
            mappings: BTreeMap::new(),
            plain: BTreeMap::new(),
        }
    }

    /// How many GPUs the fake has.
    pub fn gpus(&self) -> usize {
        self.used.len()
    }

    /// The bytes in use on GPU `gpu` (0 for a GPU the fake does not have).
    pub fn used(&self, gpu: usize) -> usize {
        self.used.get(gpu).copied().unwrap_or(0)
    }

    /// Takes `size` bytes of GPU `gpu`'s memory: `CUDA_ERROR_INVALID_DEVICE` for a GPU the fake
    /// does not have, `CUDA_ERROR_OUT_OF_MEMORY` when that GPU is full.
    fn take_gpu_memory(&mut self, gpu: usize, size: usize) -> Result<(), Code> {
        let total = self.total;
        let used = self.used.get_mut(gpu).ok_or(CUDA_ERROR_INVALID_DEVICE)?;
        if *used + size > total {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        *used += size;
        if gpu == 0 {
            self.peak = self.peak.max(self.used[0]);
        }
        Ok(())
    }

    /// Another program takes `bytes` of GPU `gpu`'s memory (negative: gives them back): for
    /// tests of a lender running short (`tiermem_fake_hold`).
    pub fn hold(&mut self, gpu: usize, bytes: isize) -> Result<(), Code> {
        if bytes >= 0 {
            return self.take_gpu_memory(gpu, bytes.unsigned_abs());
        }
        match self.used.get(gpu) {
            Some(&used) if used >= bytes.unsigned_abs() => {
                self.give_gpu_memory(gpu, bytes.unsigned_abs());
                Ok(())
            }
            Some(_) => Err(CUDA_ERROR_INVALID_VALUE),
            None => Err(CUDA_ERROR_INVALID_DEVICE),
        }
    }

    /// Gives `size` bytes back to GPU `gpu`, which took them.
    fn give_gpu_memory(&mut self, gpu: usize, size: usize) {
        if let Some(used) = self.used.get_mut(gpu) {
            *used -= size;
        }
    }

    pub fn reserve(&mut self, size: usize) -> Result<u64, Code> {
        if size == 0 || !size.is_multiple_of(GRANULARITY) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // Over-reserve by one granule, then trim, so the range is granule-aligned like the driver's.
        let base = anonymous(std::ptr::null_mut(), size + GRANULARITY, libc::PROT_NONE, false)?;
        let va = base.next_multiple_of(GRANULARITY as u64);
        let (head, tail) = ((va - base) as usize, (base + GRANULARITY as u64 - va) as usize);
        // SAFETY: unmaps the untrimmed ends of the range just mapped, which nothing else uses.
        unsafe {
            if head > 0 {
                libc::munmap(base as *mut libc::c_void, head);
            }
            if tail > 0 {
                libc::munmap((va + size as u64) as *mut libc::c_void, tail);
            }
        }
        self.reservations.insert(va, size);
        Ok(va)
    }

    pub fn unreserve(&mut self, va: u64, size: usize) -> Result<(), Code> {
        if self.reservations.get(&va) != Some(&size) || self.mappings.range(va..va + size as u64).next().is_some() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.reservations.remove(&va);
        // SAFETY: the whole reservation, which this fake mapped and nothing is mapped into now.
        unsafe { libc::munmap(va as *mut libc::c_void, size) };
        Ok(())
    }

    /// A chunk of `size` bytes at `place` (`cuMemCreate`); one on a GPU takes that GPU's memory.
    pub fn create(&mut self, size: usize, place: Place, shareable: bool) -> Result<u64, Code> {
        if size == 0 || !size.is_multiple_of(GRANULARITY) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if let Place::Gpu(gpu) = place {
            self.take_gpu_memory(gpu, size)?;
        }
        let memfd = memfd(size).inspect_err(|_| {
            if let Place::Gpu(gpu) = place {
                self.give_gpu_memory(gpu, size);
            }
        })?;
        Ok(self.insert(Chunk { memfd, size, place, shareable }))
    }

    fn insert(&mut self, chunk: Chunk) -> u64 {
        let handle = self.next_handle;
        self.next_handle += 1;
        self.chunks.insert(handle, chunk);
        handle
    }

    /// A descriptor for a shareable chunk (`cuMemExportToShareableHandle`): its memfd, which
    /// another process maps as this one does. A chunk made without the handle type is refused.
    pub fn export(&self, handle: u64) -> Result<OwnedFd, Code> {
        let chunk = self.chunks.get(&handle).filter(|c| c.shareable).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        chunk.memfd.try_clone().map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)
    }

    /// A chunk of this process for an exported one's descriptor (`cuMemImportFromShareableHandle`);
    /// its memory is counted where it was made, not here.
    pub fn import(&mut self, fd: std::os::fd::BorrowedFd<'_>) -> Result<u64, Code> {
        let memfd = fd.try_clone_to_owned().map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: an all-zero stat is valid; fstat fills it for an open descriptor.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid descriptor and out-pointer.
        if unsafe { libc::fstat(memfd.as_raw_fd(), &mut stat) } != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let size = usize::try_from(stat.st_size).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        if size == 0 || size % GRANULARITY != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok(self.insert(Chunk { memfd, size, place: Place::Host, shareable: true }))
    }

    /// Releases a chunk's handle; as with the driver, a mapping keeps its memory until unmapped.
    pub fn release(&mut self, handle: u64) -> Result<(), Code> {
        let chunk = self.chunks.remove(&handle).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if let Place::Gpu(gpu) = chunk.place {
            self.give_gpu_memory(gpu, chunk.size);
        }
        Ok(())
    }

    /// Whether `va..va+size` lies in one reservation (mapped or not).
    pub fn reserved(&self, va: u64, size: usize) -> bool {
        self.reservation_holds(va, size)
    }

    fn reservation_holds(&self, va: u64, size: usize) -> bool {
        self.reservations.range(..=va).next_back().is_some_and(|(&start, &len)| va + size as u64 <= start + len as u64)
    }

    pub fn map(&mut self, va: u64, size: usize, offset: usize, handle: u64) -> Result<(), Code> {
        let chunk = self.chunks.get(&handle).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let overlaps =
            self.mappings.range(..va + size as u64).next_back().is_some_and(|(&s, m)| s + m.size as u64 > va);
        if offset != 0 || size != chunk.size || !self.reservation_holds(va, size) || overlaps {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let flags = libc::MAP_SHARED | libc::MAP_FIXED;
        // SAFETY: `va..va+size` lies in a reservation of this fake and nothing is mapped there.
        let p =
            unsafe { libc::mmap(va as *mut libc::c_void, size, libc::PROT_NONE, flags, chunk.memfd.as_raw_fd(), 0) };
        if p == libc::MAP_FAILED {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        self.mappings.insert(va, Mapping { size, accessible: false, handle });
        Ok(())
    }

    /// The mappings that tile `va..va+size` exactly, or `None`.
    fn tiling(&self, va: u64, size: usize) -> Option<Vec<u64>> {
        let mut at = va;
        let mut starts = Vec::new();
        for (&start, mapping) in self.mappings.range(va..va + size as u64) {
            if start != at {
                return None;
            }
            starts.push(start);
            at += mapping.size as u64;
        }
        (at == va + size as u64 && size > 0).then_some(starts)
    }

    pub fn unmap(&mut self, va: u64, size: usize) -> Result<(), Code> {
        let starts = self.tiling(va, size).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        anonymous(va as *mut libc::c_void, size, libc::PROT_NONE, true)?;
        for start in starts {
            self.mappings.remove(&start);
        }
        Ok(())
    }

    pub fn set_access(&mut self, va: u64, size: usize) -> Result<(), Code> {
        let starts = self.tiling(va, size).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the range is mapped by this fake (memfd mappings), so changing its protection
        // touches no one else's memory.
        if unsafe { libc::mprotect(va as *mut libc::c_void, size, libc::PROT_READ | libc::PROT_WRITE) } != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        for start in starts {
            if let Some(mapping) = self.mappings.get_mut(&start) {
                mapping.accessible = true;
            }
        }
        Ok(())
    }

    /// A plain allocation of `size` bytes of GPU `gpu`'s memory, made in context `ctx`.
    pub fn alloc_plain(&mut self, size: usize, gpu: usize, ctx: usize) -> Result<u64, Code> {
        if size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.take_gpu_memory(gpu, size)?;
        let ptr =
            anonymous(std::ptr::null_mut(), size, libc::PROT_READ | libc::PROT_WRITE, false).inspect_err(|_| {
                self.give_gpu_memory(gpu, size);
            })?;
        self.plain.insert(ptr, Plain { size, gpu, ctx });
        Ok(ptr)
    }

    pub fn free_plain(&mut self, ptr: u64) -> Result<(), Code> {
        let Plain { size, gpu, .. } = self.plain.remove(&ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        self.give_gpu_memory(gpu, size);
        // SAFETY: a whole anonymous mapping this fake made for the allocation just removed.
        unsafe { libc::munmap(ptr as *mut libc::c_void, size) };
        Ok(())
    }

    /// Frees every plain allocation made in context `ctx`, as destroying or resetting it does;
    /// how many.
    pub fn free_plain_of(&mut self, ctx: usize) -> usize {
        let ptrs: Vec<u64> = self.plain.iter().filter(|(_, p)| p.ctx == ctx).map(|(&ptr, _)| ptr).collect();
        ptrs.iter().filter(|&&ptr| self.free_plain(ptr).is_ok()).count()
    }

    /// Whether `len` bytes at `ptr` are device memory a copy may touch: inside one plain
    /// allocation, or in consecutive mappings with access.
    pub fn accessible(&self, ptr: u64, len: usize) -> bool {
        let end = ptr + len as u64;
        if self.plain.range(..=ptr).next_back().is_some_and(|(&s, p)| end <= s + p.size as u64) {
            return true;
        }
        let Some((&first, _)) = self.mappings.range(..=ptr).next_back() else { return false };
        let mut at = first;
        for (&start, mapping) in self.mappings.range(first..end) {
            if start != at || !mapping.accessible {
                return false;
            }
            at += mapping.size as u64;
        }
        at >= end
    }

    /// What the driver says of `ptr`'s range: for a plain allocation, it; for VMM memory, the
    /// mapping (one physical chunk) holding it and the reservation holding it (as the real
    /// driver does: `cuMemGetAddressRange` answers the mapping, `cuPointerGetAttribute`'s range
    /// the reservation). The allocation or mapping, and the reservation if VMM; `None`: not
    /// device memory.
    pub fn range(&self, ptr: u64) -> Option<(Span, Option<Span>)> {
        if let Some((&start, p)) = self.plain.range(..=ptr).next_back().filter(|(&s, p)| ptr < s + p.size as u64) {
            return Some(((start, p.size), None));
        }
        let (&start, mapping) = self.mappings.range(..=ptr).next_back().filter(|(&s, m)| ptr < s + m.size as u64)?;
        let reservation = self.reservations.range(..=ptr).next_back().map(|(&s, &n)| (s, n));
        Some(((start, mapping.size), reservation))
    }

    /// Where the chunk mapped at `va` lives; `None`: nothing is mapped there. A chunk released
    /// while mapped reads as the host's.
    pub fn location(&self, va: u64) -> Option<Place> {
        let (&start, mapping) = self.mappings.range(..=va).next_back()?;
        (va < start + mapping.size as u64).then(|| self.chunks.get(&mapping.handle).map_or(Place::Host, |c| c.place))
    }

    /// The handle of the chunk mapped at `va`, if it is still alive.
    pub fn mapped_handle(&self, va: u64) -> Option<u64> {
        let (&start, mapping) = self.mappings.range(..=va).next_back()?;
        (va < start + mapping.size as u64 && self.chunks.contains_key(&mapping.handle)).then_some(mapping.handle)
    }

    /// How many chunks live at a place `wanted` accepts.
    fn chunks_where(&self, wanted: impl Fn(Place) -> bool) -> usize {
        self.chunks.values().filter(|c| wanted(c.place)).count()
    }

    pub fn census(&self) -> Census {
        Census {
            gpu_chunks: self.chunks_where(|p| p == Place::Gpu(0)),
            host_chunks: self.chunks_where(|p| p == Place::Host),
            reservations: self.reservations.len(),
            mappings: self.mappings.len(),
            plain: self.plain.len(),
            used_bytes: self.used(0),
            peak_used_bytes: self.peak,
            neighbour_chunks: self.chunks_where(|p| matches!(p, Place::Gpu(gpu) if gpu > 0)),
            neighbour_used_bytes: self.used.iter().skip(1).sum(),
            ..Census::default()
        }
    }
}

/// A memfd of `size` bytes, the memory of one chunk.
fn memfd(size: usize) -> Result<OwnedFd, Code> {
    // SAFETY: memfd_create with a NUL-terminated name; returns a new fd or -1.
    let fd = unsafe { libc::memfd_create(c"tiermem-fakecuda".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    // SAFETY: `fd` was just returned by memfd_create and is owned by nobody else.
    let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain syscall on the fd just made.
    if unsafe { libc::ftruncate(memfd.as_raw_fd(), size as libc::off_t) } != 0 {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    Ok(memfd)
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: usize = GRANULARITY;

    #[test]
    fn a_neighbour_chunk_takes_gpu_1s_memory_and_gives_it_back() {
        let mut memory = Memory::new(4 * G, 2);
        let near = memory.create(G, Place::Gpu(0), false).unwrap();
        let far = memory.create(2 * G, Place::Gpu(1), false).unwrap();
        let census = memory.census();
        assert_eq!((census.gpu_chunks, census.used_bytes), (1, G), "GPU 0 holds only its own chunk");
        assert_eq!((census.neighbour_chunks, census.neighbour_used_bytes), (1, 2 * G));
        assert_eq!(census.peak_used_bytes, G, "the peak is GPU 0's");
        memory.release(far).unwrap();
        memory.release(near).unwrap();
        assert_eq!(memory.census(), Census { peak_used_bytes: G, ..Census::default() });
    }

    #[test]
    fn gpu_1_runs_out_on_its_own() {
        let mut memory = Memory::new(2 * G, 2);
        let far = memory.create(2 * G, Place::Gpu(1), false).unwrap();
        assert_eq!(memory.create(G, Place::Gpu(1), false).err(), Some(CUDA_ERROR_OUT_OF_MEMORY));
        assert!(memory.create(2 * G, Place::Gpu(0), false).is_ok(), "GPU 0's memory is all free");
        memory.release(far).unwrap();
        assert!(memory.create(G, Place::Gpu(1), false).is_ok(), "GPU 1 has its memory back");
    }

    #[test]
    fn one_gpu_has_no_neighbour() {
        let mut memory = Memory::new(2 * G, 1);
        assert_eq!(memory.gpus(), 1);
        assert_eq!(memory.create(G, Place::Gpu(1), false).err(), Some(CUDA_ERROR_INVALID_DEVICE));
        assert_eq!(memory.alloc_plain(G, 1, 0).err(), Some(CUDA_ERROR_INVALID_DEVICE));
        assert_eq!(memory.census(), Census::default());
    }

    #[test]
    fn a_neighbour_chunk_maps_and_reads_as_gpu_1s() {
        let mut memory = Memory::new(4 * G, 2);
        let va = memory.reserve(2 * G).unwrap();
        let (near, far) =
            (memory.create(G, Place::Gpu(0), false).unwrap(), memory.create(G, Place::Gpu(1), true).unwrap());
        memory.map(va, G, 0, near).unwrap();
        memory.map(va + G as u64, G, 0, far).unwrap();
        memory.set_access(va, 2 * G).unwrap();
        assert!(memory.accessible(va, 2 * G), "one range over both GPUs' chunks");
        assert_eq!(memory.location(va), Some(Place::Gpu(0)));
        assert_eq!(memory.location(va + G as u64), Some(Place::Gpu(1)));
        assert!(memory.export(far).is_ok(), "a shareable neighbour chunk exports");
        memory.release(far).unwrap();
        assert_eq!(memory.location(va + G as u64), Some(Place::Host), "released while mapped");
        assert_eq!(memory.used(1), 0);
        memory.unmap(va, 2 * G).unwrap();
        memory.release(near).unwrap();
        memory.unreserve(va, 2 * G).unwrap();
    }

    #[test]
    fn plain_memory_is_its_gpus() {
        let mut memory = Memory::new(2 * G, 2);
        let p = memory.alloc_plain(G, 1, 0).unwrap();
        assert_eq!((memory.used(0), memory.used(1)), (0, G));
        memory.free_plain(p).unwrap();
        assert_eq!(memory.used(1), 0);
    }
}
