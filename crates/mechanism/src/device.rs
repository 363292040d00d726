//! The `Device` trait: everything tiermem asks of a GPU (virtual address reservations,
//! physical chunks, mappings, pinned host memory, streams, events, asynchronous copies and the
//! pattern kernels), so the engine is written once for the CUDA driver (cuda/) and the
//! simulated device (sim/). Implementations decide nothing: they do what they are asked and
//! report the driver's answer as a `DeviceError` naming the call.
//!
//! A device is one GPU of a machine that may have several. Physical chunks have a
//! [`ChunkLocation`]: the HBM of any GPU (this one's or a neighbour's) or pinned host memory.
//! Wherever a chunk lives, it is mapped into a reservation like any other, and the GPUs named
//! in [`Device::set_access_from`] may then touch it there: a chunk in a neighbour's HBM or in
//! host memory stays addressable, only slower. Invariants the backends keep:
//!
//! * a mapping is touched only by GPUs given access to it: work run by another GPU (a copy,
//!   a memset, a kernel, on that GPU's stream) is an error (on a GPU an illegal-address fault);
//! * access from GPU `g` to a chunk in GPU `k`'s HBM needs `g == k` or peer access from `g`
//!   to `k` ([`Device::peer_access`]); a chunk in host memory may be opened to any GPU;
//! * `create_chunk`, `set_access` are this GPU's case of `create_chunk_at`, `set_access_from`.
//!
//! An allocation made with [`Device::create_shareable_chunks_at`] can also be handed to another
//! process: [`Device::export_chunk`] gives a POSIX file descriptor for it, which that process
//! (sent it over a Unix socket) turns into a handle of its own with [`Device::import_chunk`] and
//! maps like any chunk. Bytes written through any mapping, in either process, are seen through
//! every other; the memory lives until the last handle of every process is released and unmapped.

use crate::Result;

/// A device virtual address (CUDA `CUdeviceptr`; on the simulated device, a host address).
pub type DevicePtr = u64;

/// Address of pinned host memory obtained from [`Device::alloc_pinned`].
pub type HostPtr = usize;

/// One physical chunk of device memory, exactly one granule (2 MiB on the H200).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PhysHandle(pub u64);

/// A stream, as the driver names it (`CUstream`). `StreamHandle(0)` is the legacy default stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamHandle(pub u64);

/// An event (`CUevent`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventHandle(pub u64);

/// Where a physical chunk's memory is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChunkLocation {
    /// The HBM of the GPU of this ordinal (this device's own or another one's).
    Gpu(usize),
    /// Pinned host memory (on CUDA, `CU_MEM_LOCATION_TYPE_HOST_NUMA` on the NUMA node closest
    /// to this GPU): slow to create, but mappable and addressable like device memory.
    Host,
}

impl std::fmt::Display for ChunkLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChunkLocation::Gpu(ordinal) => write!(f, "GPU {ordinal}"),
            ChunkLocation::Host => f.write_str("host memory"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Cuda,
    Sim,
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendKind::Cuda => "cuda",
            BackendKind::Sim => "sim (simulated device: host memory stands in for HBM)",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamPriority {
    /// Demand page-ins and evictions.
    High,
    /// Prefetches: scheduled behind demand work where the hardware allows.
    Low,
}

/// A GPU's memory, as the machine sees it ([`Device::gpu_memory`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuMemory {
    pub free: usize,
    pub total: usize,
    /// How many processes other than this one use the GPU; `None` where that is not known
    /// (no NVML, or the simulated device).
    pub other_processes: Option<usize>,
    /// Percent of the last second in which kernels of any process ran on its SMs (NVML);
    /// `None` where that is not known. Copies, its own or other GPUs' to or from its memory,
    /// do not count.
    pub busy_percent: Option<u32>,
}

/// What a device is, as probed when it was opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub backend: BackendKind,
    pub ordinal: usize,
    pub name: String,
    /// Number of devices of this backend on the machine.
    pub device_count: usize,
    /// Driver version as the vendor prints it (e.g. "580.159.04"), or the CUDA version if NVML is absent.
    pub driver_version: String,
    /// CUDA version the driver supports, e.g. "13.0".
    pub cuda_version: String,
    pub total_bytes: usize,
    /// Physical chunk size: the VMM minimum allocation granularity.
    pub granularity: usize,
    pub vmm_supported: bool,
    /// Ordinals of other devices this one can access directly (NVLink / PCIe peer access).
    pub peers: Vec<usize>,
    /// The GPU's UUID as NVML and `nvidia-smi` print it ("GPU-…"): the same GPU to every
    /// process, however each numbers its devices. `None` without NVML or on the simulated device.
    pub uuid: Option<String>,
}

/// The narrow interface the engine needs from a device. Implementations hold no policy.
///
/// Thread safety: every method may be called from any thread; implementations make the
/// device's context current themselves.
///
/// Ordering: copies and memsets are asynchronous on the given stream; `record_event`,
/// `stream_wait_event`, `event_done` and `synchronize_*` order them. The simulated device
/// completes every operation before returning, which is one valid schedule.
pub trait Device: Send + Sync {
    fn info(&self) -> &DeviceInfo;
    /// Whether this GPU can access memory of GPU `ordinal` directly (NVLink or PCIe peer
    /// access, as probed at open: [`DeviceInfo::peers`]). False for this GPU itself.
    fn peer_access(&self, ordinal: usize) -> bool {
        self.info().peers.contains(&ordinal)
    }
    /// Free and total device memory in bytes, as the driver reports them now.
    fn mem_info(&self) -> Result<(usize, usize)>;
    /// The memory of GPU `ordinal` of this machine (this one or a neighbour), as the whole
    /// machine sees it now: what a neighbour could lend. This GPU's own answer is `mem_info`'s.
    fn gpu_memory(&self, ordinal: usize) -> Result<GpuMemory> {
        if ordinal != self.info().ordinal {
            return Err(crate::DeviceError::Unsupported(format!("the memory of GPU {ordinal} is not known here")));
        }
        let (free, total) = self.mem_info()?;
        Ok(GpuMemory { free, total, other_processes: None, busy_percent: None })
    }

    /// GPU `ordinal` of this machine as a device of its own, sharing this one's address space:
    /// work on its streams runs on its engines (a copy from host memory it runs crosses its
    /// own PCIe link). For the second path into this GPU (multipath page-in).
    fn neighbour(&self, ordinal: usize) -> Result<std::sync::Arc<dyn Device>> {
        Err(crate::DeviceError::Unsupported(format!("GPU {ordinal} cannot be driven from here")))
    }

    /// Reserves `size` bytes (a multiple of the granularity) of device virtual address space.
    fn reserve(&self, size: usize) -> Result<DevicePtr>;
    /// Frees a reservation; nothing in it may still be mapped.
    fn unreserve(&self, va: DevicePtr, size: usize) -> Result<()>;

    /// Creates one physical chunk of one granule at `location`. Errors name `cuMemCreate`;
    /// a full GPU is [`DeviceError::OutOfMemory`](crate::DeviceError::OutOfMemory), a location
    /// the driver cannot allocate at (host memory on an old driver) is `Unsupported`.
    fn create_chunk_at(&self, location: ChunkLocation) -> Result<PhysHandle>;
    /// Creates one physical chunk of one granule in this device's HBM.
    fn create_chunk(&self) -> Result<PhysHandle> {
        self.create_chunk_at(ChunkLocation::Gpu(self.info().ordinal))
    }
    /// Creates one physical allocation of `granules` granules at `location`, mapped with
    /// [`Device::map_sized`] as one mapping: unmapping it then costs one driver call, not one
    /// per granule (~33 µs each on an H200). A peer tier's slab is one.
    fn create_chunks_at(&self, location: ChunkLocation, granules: usize) -> Result<PhysHandle> {
        match granules {
            1 => self.create_chunk_at(location),
            n => Err(crate::DeviceError::Unsupported(format!("allocations of {n} granules"))),
        }
    }
    /// Maps all `size` bytes of an allocation made by [`Device::create_chunks_at`] at `va`.
    fn map_sized(&self, va: DevicePtr, chunk: PhysHandle, size: usize) -> Result<()> {
        match size == self.info().granularity {
            true => self.map(va, chunk),
            false => Err(crate::DeviceError::Unsupported(format!("mappings of {size} bytes"))),
        }
    }
    /// Releases a physical chunk; it must not be mapped anywhere.
    fn release_chunk(&self, chunk: PhysHandle) -> Result<()>;
    /// Gives up the handle of a chunk that stays mapped: its memory is freed when its last
    /// mapping is unmapped (`cuMemRelease` on a mapped allocation). For chunks given back all
    /// at once by unmapping their range (a peer tier's slab), with no call per chunk then.
    fn release_mapped_chunk(&self, chunk: PhysHandle) -> Result<()> {
        self.release_chunk(chunk)
    }
    /// Creates one allocation of `granules` granules at `location` that another process can import
    /// ([`Device::export_chunk`]): as [`Device::create_chunks_at`] otherwise (mapped with
    /// [`Device::map_sized`], released with `release_chunk`/`release_mapped_chunk`). Errors name
    /// `cuMemCreate`.
    fn create_shareable_chunks_at(&self, location: ChunkLocation, granules: usize) -> Result<PhysHandle> {
        Err(crate::DeviceError::Unsupported(format!(
            "cuMemCreate of a shareable allocation ({granules} granules at {location}) on this device"
        )))
    }
    /// A POSIX file descriptor for an allocation made by [`Device::create_shareable_chunks_at`]
    /// (`cuMemExportToShareableHandle`), to pass to another process (SCM_RIGHTS) that imports it.
    /// The caller owns the descriptor; closing it does not free the memory.
    fn export_chunk(&self, chunk: PhysHandle) -> Result<std::os::fd::OwnedFd> {
        Err(crate::DeviceError::Unsupported(format!(
            "cuMemExportToShareableHandle of allocation 0x{:x} on this device",
            chunk.0
        )))
    }
    /// A handle of this process to the allocation behind `fd` (exported by
    /// [`Device::export_chunk`], maybe in another process), `size` bytes long
    /// (`cuMemImportFromShareableHandle`): mapped with [`Device::map_sized`] and given up with
    /// `release_chunk`/`release_mapped_chunk` like one made here. The memory is freed once every
    /// process has released its handle and unmapped it. `fd` stays the caller's.
    fn import_chunk(&self, fd: std::os::fd::BorrowedFd<'_>, size: usize) -> Result<PhysHandle> {
        use std::os::fd::AsRawFd;
        Err(crate::DeviceError::Unsupported(format!(
            "cuMemImportFromShareableHandle of fd {} ({size} bytes) on this device",
            fd.as_raw_fd()
        )))
    }
    /// Maps `chunk` (of any location) at `va` (granule-aligned, inside a reservation, not yet
    /// mapped). The mapping is not accessible until [`Device::set_access_from`] covers it.
    fn map(&self, va: DevicePtr, chunk: PhysHandle) -> Result<()>;
    /// Makes `[va, va + size)`, all of it mapped, readable and writable by each GPU of
    /// `gpus` (ordinals; at least one), in one `cuMemSetAccess`. Access already given to
    /// other GPUs stays. Fails, changing nothing, if a GPU does not exist or cannot reach a
    /// chunk of the range (no peer access to the GPU it lives on).
    fn set_access_from(&self, va: DevicePtr, size: usize, gpus: &[usize]) -> Result<()>;
    /// Makes `[va, va + size)`, all of it mapped, readable and writable by this device.
    fn set_access(&self, va: DevicePtr, size: usize) -> Result<()> {
        self.set_access_from(va, size, &[self.info().ordinal])
    }
    /// Unmaps `[va, va + size)`, which must consist of whole mapped chunks.
    fn unmap(&self, va: DevicePtr, size: usize) -> Result<()>;

    /// Allocates `size` bytes of page-locked host memory the device can copy to and from.
    fn alloc_pinned(&self, size: usize) -> Result<HostPtr>;
    /// The same memory as [`Device::alloc_pinned`], had with less of the machine: for memory
    /// pinned ahead of need while the program and other processes work (on the GPU, two
    /// threads at CPU priority nice 10 fault its pages in; slower, and nobody waits for it).
    /// Freed by [`Device::free_pinned`].
    fn alloc_pinned_gently(&self, size: usize) -> Result<HostPtr> {
        self.alloc_pinned(size)
    }
    /// Frees memory from [`Device::alloc_pinned`].
    fn free_pinned(&self, ptr: HostPtr, size: usize) -> Result<()>;

    fn create_stream(&self, priority: StreamPriority) -> Result<StreamHandle>;
    fn destroy_stream(&self, stream: StreamHandle) -> Result<()>;
    /// Creates an event; `timing` enables [`Device::elapsed_ms`] on it (slightly costlier).
    fn create_event(&self, timing: bool) -> Result<EventHandle>;
    fn destroy_event(&self, event: EventHandle) -> Result<()>;
    fn record_event(&self, event: EventHandle, stream: StreamHandle) -> Result<()>;
    /// Makes future work on `stream` wait for `event`, without blocking the host.
    fn stream_wait_event(&self, stream: StreamHandle, event: EventHandle) -> Result<()>;
    /// Whether all work captured by `event` has completed (never blocks).
    fn event_done(&self, event: EventHandle) -> Result<bool>;
    fn synchronize_event(&self, event: EventHandle) -> Result<()>;
    fn synchronize_stream(&self, stream: StreamHandle) -> Result<()>;
    /// Milliseconds between two completed timing events.
    fn elapsed_ms(&self, start: EventHandle, end: EventHandle) -> Result<f32>;

    /// Enqueues a copy of `len` bytes from pinned host memory to device memory.
    ///
    /// # Safety
    /// `src..src+len` must be pinned memory from this device that stays valid and unmodified
    /// until the copy has completed on `stream`.
    unsafe fn copy_to_device_async(&self, dst: DevicePtr, src: HostPtr, len: usize, stream: StreamHandle)
        -> Result<()>;
    /// Enqueues a copy of `len` bytes from device memory to pinned host memory.
    ///
    /// # Safety
    /// `dst..dst+len` must be pinned memory from this device, valid and not otherwise
    /// accessed until the copy has completed on `stream`.
    unsafe fn copy_to_host_async(&self, dst: HostPtr, src: DevicePtr, len: usize, stream: StreamHandle) -> Result<()>;
    /// Enqueues a copy of `len` bytes between two ranges of device memory (mapped chunks of
    /// any location, or plain allocations), run by the GPU of `stream`, which needs access
    /// to both: for instance from a chunk in this GPU's HBM to one in a neighbour's, over
    /// NVLink. The ranges must not overlap.
    fn copy_between_devices_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: usize,
        stream: StreamHandle,
    ) -> Result<()>;
    /// Enqueues setting `len` bytes at `dst` to `value`.
    fn memset_async(&self, dst: DevicePtr, value: u8, len: usize, stream: StreamHandle) -> Result<()>;

    /// Enqueues a kernel that writes the pattern of `seed` ([`crate::pattern`]) over `words`
    /// 8-byte words at `dst` (8-byte aligned), word `i` being pattern word `first + i`.
    fn fill_pattern_async(
        &self,
        dst: DevicePtr,
        words: usize,
        seed: u64,
        first: u64,
        stream: StreamHandle,
    ) -> Result<()>;
    /// Enqueues a kernel that reads `words` words at `src` and adds to the `u32` at `counter`
    /// (device memory, e.g. from [`Device::alloc_plain`]) how many differ from that pattern.
    fn check_pattern_async(
        &self,
        src: DevicePtr,
        words: usize,
        seed: u64,
        first: u64,
        counter: DevicePtr,
        stream: StreamHandle,
    ) -> Result<()>;

    /// Copies ordinary (pageable) host bytes to device memory and waits for the copy.
    fn write(&self, dst: DevicePtr, src: &[u8]) -> Result<()>;
    /// Copies device memory to ordinary host memory and waits for the copy.
    fn read(&self, src: DevicePtr, dst: &mut [u8]) -> Result<()>;

    /// Plain device allocation outside tiermem (used to measure raw-copy ceilings).
    fn alloc_plain(&self, size: usize) -> Result<DevicePtr>;
    fn free_plain(&self, ptr: DevicePtr) -> Result<()>;
}
