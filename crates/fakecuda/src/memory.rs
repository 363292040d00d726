//! The fake driver's memory, as `crates/mechanism/src/sim` does it: device pointers are host
//! addresses. A reservation is `mmap(PROT_NONE)`; a physical chunk is a memfd of its size; a
//! mapping is `mmap(MAP_FIXED | MAP_SHARED)` of that memfd into a reservation, inaccessible
//! until `cuMemSetAccess` makes it read-write; an unmapping puts `PROT_NONE` pages back.
//! Plain allocations (`cuMemAlloc_v2` and friends) are anonymous read-write mappings. Chunks on
//! the GPU and plain allocations count against the fake GPU's memory; host chunks do not.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::{Code, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY};

/// A range of addresses: its start and bytes.
pub type Span = (u64, usize);

/// The fake's granularity, for chunks on the GPU and on the host.
pub const GRANULARITY: usize = 2 << 20;

struct Chunk {
    memfd: OwnedFd,
    size: usize,
    on_gpu: bool,
    /// Made with `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`: it may be exported.
    shareable: bool,
}

struct Mapping {
    size: usize,
    accessible: bool,
    handle: u64,
}

/// Everything the fake driver holds. Not thread-safe by itself (lib.rs locks it).
pub struct Memory {
    pub total: usize,
    pub used: usize,
    /// The most GPU memory held at once.
    peak: usize,
    chunks: BTreeMap<u64, Chunk>,
    next_handle: u64,
    reservations: BTreeMap<u64, usize>,
    mappings: BTreeMap<u64, Mapping>,
    plain: BTreeMap<u64, usize>,
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
    /// The most GPU memory (chunks and plain allocations) held at once so far.
    pub peak_used_bytes: usize,
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
    pub fn new(total: usize) -> Self {
        Memory {
            total,
            used: 0,
            peak: 0,
            chunks: BTreeMap::new(),
            next_handle: 1,
            reservations: BTreeMap::new(),
            mappings: BTreeMap::new(),
            plain: BTreeMap::new(),
        }
    }

    fn take_gpu_memory(&mut self, size: usize) -> Result<(), Code> {
        if self.used + size > self.total {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        self.used += size;
        self.peak = self.peak.max(self.used);
        Ok(())
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

    pub fn create(&mut self, size: usize, on_gpu: bool, shareable: bool) -> Result<u64, Code> {
        if size == 0 || !size.is_multiple_of(GRANULARITY) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if on_gpu {
            self.take_gpu_memory(size)?;
        }
        // SAFETY: memfd_create with a NUL-terminated name; returns a new fd or -1.
        let fd = unsafe { libc::memfd_create(c"tiermem-fakecuda".as_ptr(), libc::MFD_CLOEXEC) };
        // SAFETY: plain syscall on the fd just made (if any).
        if fd < 0 || unsafe { libc::ftruncate(fd, size as libc::off_t) } != 0 {
            self.used -= if on_gpu { size } else { 0 };
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        // SAFETY: `fd` was just returned by memfd_create and is owned by nobody else.
        let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(self.insert(Chunk { memfd, size, on_gpu, shareable }))
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
        Ok(self.insert(Chunk { memfd, size, on_gpu: false, shareable: true }))
    }

    /// Releases a chunk's handle; as with the driver, a mapping keeps its memory until unmapped.
    pub fn release(&mut self, handle: u64) -> Result<(), Code> {
        let chunk = self.chunks.remove(&handle).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if chunk.on_gpu {
            self.used -= chunk.size;
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

    pub fn alloc_plain(&mut self, size: usize) -> Result<u64, Code> {
        if size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.take_gpu_memory(size)?;
        let ptr =
            anonymous(std::ptr::null_mut(), size, libc::PROT_READ | libc::PROT_WRITE, false).inspect_err(|_| {
                self.used -= size;
            })?;
        self.plain.insert(ptr, size);
        Ok(ptr)
    }

    pub fn free_plain(&mut self, ptr: u64) -> Result<(), Code> {
        let size = self.plain.remove(&ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        self.used -= size;
        // SAFETY: a whole anonymous mapping this fake made for the allocation just removed.
        unsafe { libc::munmap(ptr as *mut libc::c_void, size) };
        Ok(())
    }

    /// Whether `len` bytes at `ptr` are device memory a copy may touch: inside one plain
    /// allocation, or in consecutive mappings with access.
    pub fn accessible(&self, ptr: u64, len: usize) -> bool {
        let end = ptr + len as u64;
        if self.plain.range(..=ptr).next_back().is_some_and(|(&s, &size)| end <= s + size as u64) {
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
        if let Some((&start, &size)) = self.plain.range(..=ptr).next_back().filter(|(&s, &n)| ptr < s + n as u64) {
            return Some(((start, size), None));
        }
        let (&start, mapping) = self.mappings.range(..=ptr).next_back().filter(|(&s, m)| ptr < s + m.size as u64)?;
        let reservation = self.reservations.range(..=ptr).next_back().map(|(&s, &n)| (s, n));
        Some(((start, mapping.size), reservation))
    }

    /// Where the chunk mapped at `va` lives: `Some(true)` on the GPU, `Some(false)` on the host.
    pub fn location(&self, va: u64) -> Option<bool> {
        let (&start, mapping) = self.mappings.range(..=va).next_back()?;
        (va < start + mapping.size as u64).then(|| self.chunks.get(&mapping.handle).is_some_and(|c| c.on_gpu))
    }

    pub fn census(&self) -> Census {
        Census {
            gpu_chunks: self.chunks.values().filter(|c| c.on_gpu).count(),
            host_chunks: self.chunks.values().filter(|c| !c.on_gpu).count(),
            reservations: self.reservations.len(),
            mappings: self.mappings.len(),
            plain: self.plain.len(),
            used_bytes: self.used,
            peak_used_bytes: self.peak,
            ..Census::default()
        }
    }
}
