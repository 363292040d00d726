//! A fake `libcuda.so.1` for CI: one GPU, or two, whose memory is host memory (memory.rs),
//! enough of the driver API for the mechanism crate's `CudaDevice::open` and chunk operations,
//! for the memory calls libtiermem_preload.so routes, and for `cuGetProcAddress` with versions
//! and per-thread-stream variants. Tests put a `libcuda.so.1` link to it on `LD_LIBRARY_PATH`.
//!
//! Settings (environment, read at `cuInit`): `TIERMEM_FAKE_HBM` — bytes of each fake GPU's
//! memory (default 1 GiB); `TIERMEM_FAKE_HOST_CHUNKS=0` — the driver says it cannot put VMM
//! chunks in host memory (an older driver); `TIERMEM_FAKE_GPUS=2` — a second GPU (anything
//! else: one), a peer of the first, on PCI bus 2 (GPU 0 is on bus 1). Timing, for tests of
//! what tiermem chooses by time: `TIERMEM_FAKE_SYNC_US` — each `cuCtxSynchronize` takes that
//! long; `TIERMEM_FAKE_HOST_READ_US` — a kernel takes that long for each pointer argument into
//! a chunk in host memory (as a kernel reading over PCIe would).
//!
//! With two GPUs, chunks made on GPU 1 (`cuMemCreate` at device 1) take GPU 1's memory and are
//! mapped, given access, copied and shared like GPU 0's; `tiermem_fake_census` counts them as
//! the neighbour's. Each GPU has a primary context; memory calls answer for the GPU of the
//! calling thread's current context (GPU 0's when none is current).
//!
//! Kernels are handles a test registers, which touch the memory their pointer arguments name
//! when launched (kernel.rs); tests can make one call of a few chunk operations fail.
//!
//! Memory pools: the default one, created ones, allocations from them and trims (pools.rs).
//! CUDA graphs made by stream capture, instantiated and launched (graphs.rs).
//!
//! What is not here: streams, event timing, pinned host memory, most asynchronous copies. The entry
//! points the mechanism checks for at open exist, and answer `CUDA_ERROR_NOT_SUPPORTED`. Work
//! is never in flight (launches and copies run at once), so synchronizing returns at once.

mod contexts;
mod device;
mod events;
mod graphs;
mod ipc;
mod kernel;
mod memory;
mod nvml;
mod pointers;
mod pools;
mod proc_address;
#[cfg(test)]
mod tests;

use std::cell::Cell;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

pub use memory::Census;
use memory::{Memory, Place, GRANULARITY};

/// A `CUresult`.
pub type Code = u32;

pub const CUDA_SUCCESS: Code = 0;
pub const CUDA_ERROR_INVALID_VALUE: Code = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: Code = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: Code = 3;
pub const CUDA_ERROR_INVALID_DEVICE: Code = 101;
pub const CUDA_ERROR_INVALID_CONTEXT: Code = 201;
pub const CUDA_ERROR_NOT_FOUND: Code = 500;
pub const CUDA_ERROR_NOT_SUPPORTED: Code = 801;

/// GPU 0's primary context's handle: any non-null value the program cannot mistake. GPU `g`'s
/// is `PRIMARY + g * PRIMARY_STRIDE` (device.rs).
const PRIMARY: usize = 0x7e57_c000;
const PRIMARY_STRIDE: usize = 0x100;

/// `CUmemLocation`: its type (1 device, 2 host, 3 host NUMA, 4 host NUMA current) and id.
#[repr(C)]
pub struct Location {
    pub kind: c_int,
    pub id: c_int,
}

/// The prefix of `CUmemAllocationProp` the fake reads.
#[repr(C)]
pub struct AllocationProp {
    pub kind: c_int,
    pub handle_types: c_int,
    pub location: Location,
    pub win32_metadata: *mut c_void,
    pub compression: u8,
    pub gpu_direct_rdma: u8,
}

struct Settings {
    host_chunks: bool,
}

struct Fake {
    memory: Memory,
    settings: Settings,
}

static FAKE: Mutex<Option<Fake>> = Mutex::new(None);

/// Synchronizations asked for, for tests that check a free waits before it unmaps.
static CONTEXT_SYNCS: AtomicUsize = AtomicUsize::new(0);
static STREAM_SYNCS: AtomicUsize = AtomicUsize::new(0);
static LAST_SYNCED_STREAM: AtomicUsize = AtomicUsize::new(0);

/// Work is never in flight: a stream synchronization only counts, and checks the context.
pub(crate) fn stream_synchronized(stream: *mut c_void) -> Code {
    STREAM_SYNCS.fetch_add(1, Relaxed);
    LAST_SYNCED_STREAM.store(stream as usize, Relaxed);
    current_context().err().unwrap_or(CUDA_SUCCESS)
}

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

fn parse_bytes(text: &str) -> Option<usize> {
    let t = text.trim();
    let (number, shift) = match t.char_indices().last()? {
        (i, 'K' | 'k') => (&t[..i], 10),
        (i, 'M' | 'm') => (&t[..i], 20),
        (i, 'G' | 'g') => (&t[..i], 30),
        _ => (t, 0),
    };
    number.parse::<usize>().ok().map(|n| n << shift)
}

/// A delay in microseconds from setting `name` (0 when unset or not a number).
fn delay(name: &str) -> std::time::Duration {
    std::time::Duration::from_micros(std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(0))
}

/// `TIERMEM_FAKE_SYNC_US` (module documentation).
pub(crate) fn sync_delay() -> std::time::Duration {
    static DELAY: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *DELAY.get_or_init(|| delay("TIERMEM_FAKE_SYNC_US"))
}

/// `TIERMEM_FAKE_HOST_READ_US` (module documentation).
pub(crate) fn host_read_delay() -> std::time::Duration {
    static DELAY: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *DELAY.get_or_init(|| delay("TIERMEM_FAKE_HOST_READ_US"))
}

/// Runs `f` on the fake's state; `CUDA_ERROR_NOT_INITIALIZED` before `cuInit`.
fn with(f: impl FnOnce(&mut Fake) -> Code) -> Code {
    let mut guard: MutexGuard<'_, Option<Fake>> = FAKE.lock().unwrap_or_else(|p| p.into_inner());
    match guard.as_mut() {
        Some(fake) => f(fake),
        None => CUDA_ERROR_NOT_INITIALIZED,
    }
}

/// Writes `value` through `out` if it is non-null; `CUDA_ERROR_INVALID_VALUE` if it is null.
///
/// # Safety
/// `out` null or valid for a write.
unsafe fn put<T>(out: *mut T, value: T) -> Code {
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null; valid for a write by the caller's contract.
    unsafe { out.write(value) };
    CUDA_SUCCESS
}

/// `Ok(v)` → write `v` through `out`; `Err(code)` → `code`.
///
/// # Safety
/// `out` null or valid for a write.
unsafe fn answer<T>(out: *mut T, result: Result<T, Code>) -> Code {
    match result {
        // SAFETY: passed on from the caller.
        Ok(value) => unsafe { put(out, value) },
        Err(code) => code,
    }
}

/// The GPU of the calling thread's current context; `CUDA_ERROR_INVALID_CONTEXT` if none is.
pub(crate) fn current_context() -> Result<usize, Code> {
    match CURRENT.with(Cell::get) {
        0 => Err(CUDA_ERROR_INVALID_CONTEXT),
        ctx if ctx >= contexts::OWN_FIRST => contexts::gpu_of(ctx).ok_or(CUDA_ERROR_INVALID_CONTEXT),
        // Only known contexts are ever current (cuCtxSetCurrent checks).
        ctx => Ok((ctx - PRIMARY) / PRIMARY_STRIDE),
    }
}

/// The GPU memory calls answer for: the current context's, GPU 0 if none is current.
fn current_gpu() -> usize {
    current_context().unwrap_or(0)
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> Code {
    if free.is_null() || total.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let gpu = current_gpu();
    with(|fake| {
        let (size, used) = (fake.memory.total, fake.memory.used(gpu));
        // SAFETY: the caller's out-pointers, checked non-null.
        unsafe { (*free, *total) = (size - used, size) };
        CUDA_SUCCESS
    })
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const AllocationProp,
    _flags: c_int,
) -> Code {
    if prop.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the caller's out-pointer.
    with(|_| unsafe { put(granularity, GRANULARITY) })
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut u64,
    size: usize,
    _align: usize,
    _addr: u64,
    _flags: u64,
) -> Code {
    // SAFETY: the caller's out-pointer.
    with(|fake| unsafe { answer(ptr, fake.memory.reserve(size)) })
}

#[no_mangle]
pub extern "C" fn cuMemAddressFree(ptr: u64, size: usize) -> Code {
    with(|fake| fake.memory.unreserve(ptr, size).err().unwrap_or(CUDA_SUCCESS))
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(handle: *mut u64, size: usize, prop: *const AllocationProp, flags: u64) -> Code {
    if handle.is_null() || prop.is_null() || flags != 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null; the caller's allocation description.
    let location = unsafe { &(*prop).location };
    with(|fake| {
        let place = match location.kind {
            1 => match usize::try_from(location.id) {
                Ok(gpu) if gpu < fake.memory.gpus() => Place::Gpu(gpu),
                _ => return CUDA_ERROR_INVALID_DEVICE,
            },
            // As the H200's driver: host chunks cannot ask to be GPUDirect RDMA capable.
            // SAFETY: checked non-null above.
            3 | 4 if unsafe { (*prop).gpu_direct_rdma } != 0 => return CUDA_ERROR_NOT_SUPPORTED,
            3 | 4 if fake.settings.host_chunks => Place::Host,
            3 | 4 => return CUDA_ERROR_NOT_SUPPORTED,
            _ => return CUDA_ERROR_INVALID_VALUE,
        };
        // SAFETY: checked non-null above.
        let shareable = unsafe { (*prop).handle_types } & ipc::POSIX_FD != 0;
        // SAFETY: the caller's out-pointer.
        unsafe { answer(handle, fake.memory.create(size, place, shareable)) }
    })
}

#[no_mangle]
pub extern "C" fn cuMemRelease(handle: u64) -> Code {
    with(|fake| fake.memory.release(handle).err().unwrap_or(CUDA_SUCCESS))
}

#[no_mangle]
pub extern "C" fn cuMemMap(ptr: u64, size: usize, offset: usize, handle: u64, flags: u64) -> Code {
    if kernel::injected("cuMemMap") {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if flags != 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    with(|fake| fake.memory.map(ptr, size, offset, handle).err().unwrap_or(CUDA_SUCCESS))
}

/// The handle of the chunk mapped at `addr` (the fake counts no references: the caller must
/// not release it while its mapping's owner may).
///
/// # Safety
/// As the driver's: `handle` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(handle: *mut u64, addr: *mut c_void) -> Code {
    if handle.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    with(|fake| match fake.memory.mapped_handle(addr as u64) {
        Some(found) => {
            // SAFETY: checked non-null; the caller's out-pointer.
            unsafe { handle.write(found) };
            CUDA_SUCCESS
        }
        None => CUDA_ERROR_INVALID_VALUE,
    })
}

#[no_mangle]
pub extern "C" fn cuMemUnmap(ptr: u64, size: usize) -> Code {
    with(|fake| fake.memory.unmap(ptr, size).err().unwrap_or(CUDA_SUCCESS))
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuMemSetAccess(ptr: u64, size: usize, desc: *const c_void, count: usize) -> Code {
    if desc.is_null() || count == 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if kernel::injected("cuMemSetAccess") {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    with(|fake| fake.memory.set_access(ptr, size).err().unwrap_or(CUDA_SUCCESS))
}

/// A plain allocation, of the current context's GPU. The exported functions call this, never
/// each other: a preloaded library that exports the same names would get those calls (the real
/// driver does not make them either).
///
/// # Safety
/// `ptr` null or valid for a write.
unsafe fn alloc_plain(ptr: *mut u64, size: usize) -> Code {
    let gpu = match current_context() {
        Ok(gpu) => gpu,
        Err(code) => return code,
    };
    // The driver checks its arguments before it allocates anything.
    if ptr.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let ctx = CURRENT.with(Cell::get);
    // SAFETY: the caller's out-pointer.
    with(|fake| unsafe { answer(ptr, fake.memory.alloc_plain(size, gpu, ctx)) })
}

fn free_plain(ptr: u64) -> Code {
    if let Err(code) = current_context() {
        return code;
    }
    with(|fake| fake.memory.free_plain(ptr).err().unwrap_or(CUDA_SUCCESS))
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(ptr: *mut u64, size: usize) -> Code {
    // SAFETY: the caller's out-pointer.
    unsafe { alloc_plain(ptr, size) }
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    ptr: *mut u64,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: c_uint,
) -> Code {
    if pitch.is_null() || width == 0 || height == 0 || !matches!(element_size, 4 | 8 | 16) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let padded = width.next_multiple_of(512);
    // SAFETY: the caller's out-pointers.
    match unsafe { alloc_plain(ptr, padded * height) } {
        // SAFETY: the caller's out-pointer (checked non-null above).
        CUDA_SUCCESS => unsafe { put(pitch, padded) },
        code => code,
    }
}

#[no_mangle]
pub extern "C" fn cuMemFree_v2(ptr: u64) -> Code {
    free_plain(ptr)
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(ptr: *mut u64, size: usize, _stream: *mut c_void) -> Code {
    // SAFETY: the caller's out-pointer.
    unsafe { alloc_plain(ptr, size) }
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(ptr: *mut u64, size: usize, _stream: *mut c_void) -> Code {
    // SAFETY: the caller's out-pointer.
    unsafe { alloc_plain(ptr, size) }
}

#[no_mangle]
pub extern "C" fn cuMemFreeAsync(ptr: u64, _stream: *mut c_void) -> Code {
    free_plain(ptr)
}

#[no_mangle]
pub extern "C" fn cuMemFreeAsync_ptsz(ptr: u64, _stream: *mut c_void) -> Code {
    free_plain(ptr)
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(ptr: *mut u64, size: usize, _flags: c_uint) -> Code {
    // SAFETY: the caller's out-pointer.
    unsafe { alloc_plain(ptr, size) }
}

/// # Safety
/// As the driver's: `src` valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(dst: u64, src: *const c_void, len: usize) -> Code {
    with(|fake| {
        if src.is_null() || !fake.memory.accessible(dst, len) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: `dst..dst+len` is fake device memory mapped read-write (checked); `src` is
        // the caller's, valid for `len` bytes.
        unsafe { std::ptr::copy_nonoverlapping(src.cast::<u8>(), dst as *mut u8, len) };
        CUDA_SUCCESS
    })
}

/// # Safety
/// As the driver's: `dst` valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, len: usize) -> Code {
    with(|fake| {
        if dst.is_null() || !fake.memory.accessible(src, len) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: as in cuMemcpyHtoD_v2, the other way.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.cast::<u8>(), len) };
        CUDA_SUCCESS
    })
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoD_v2(dst: u64, src: u64, len: usize) -> Code {
    copy_device(dst, src, len)
}

/// A copy between two ranges of fake device memory, synchronous and asynchronous alike.
fn copy_device(dst: u64, src: u64, len: usize) -> Code {
    with(|fake| {
        if !fake.memory.accessible(dst, len) || !fake.memory.accessible(src, len) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: both ranges are fake device memory mapped read-write (checked); `copy`
        // allows them to overlap.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
        CUDA_SUCCESS
    })
}

/// # Safety
/// As the driver's: plain values only.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8_v2(dst: u64, value: u8, len: usize) -> Code {
    with(|fake| {
        if !fake.memory.accessible(dst, len) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: `dst..dst+len` is fake device memory mapped read-write (checked).
        unsafe { std::ptr::write_bytes(dst as *mut u8, value, len) };
        CUDA_SUCCESS
    })
}

/// What the fake holds now, for tests' leak checks. Not a driver function.
///
/// # Safety
/// `out` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tiermem_fake_census(out: *mut Census) -> Code {
    with(|fake| {
        let census = Census {
            context_syncs: CONTEXT_SYNCS.load(Relaxed),
            stream_syncs: STREAM_SYNCS.load(Relaxed),
            last_synced_stream: LAST_SYNCED_STREAM.load(Relaxed),
            ..fake.memory.census()
        };
        // SAFETY: the caller's out-pointer.
        unsafe { put(out, census) }
    })
}

/// Where the chunk mapped at `va` lives: 1 GPU 0, 2 the host, 3 GPU 1 (the neighbour), 0
/// nothing mapped there. Not a driver function. (A chunk released while mapped reads as the
/// host's.)
#[no_mangle]
pub extern "C" fn tiermem_fake_location(va: u64) -> c_int {
    let mut location = 0;
    with(|fake| {
        location = match fake.memory.location(va) {
            Some(Place::Gpu(0)) => 1,
            Some(Place::Host) => 2,
            Some(Place::Gpu(_)) => 3,
            None => 0,
        };
        CUDA_SUCCESS
    });
    location
}

/// Another program takes `bytes` of GPU `gpu`'s memory, or gives them back (negative): what
/// NVML and the driver then say that GPU has free. Not a driver function.
#[no_mangle]
pub extern "C" fn tiermem_fake_hold(gpu: c_int, bytes: isize) -> Code {
    let Ok(gpu) = usize::try_from(gpu) else { return CUDA_ERROR_INVALID_DEVICE };
    with(|fake| fake.memory.hold(gpu, bytes).err().unwrap_or(CUDA_SUCCESS))
}

/// Entry points the mechanism crate requires at open but the fake does not implement.
macro_rules! not_supported {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        pub extern "C" fn $name() -> Code {
            CUDA_ERROR_NOT_SUPPORTED
        }
    )*};
}

not_supported!(
    cuMemHostAlloc,
    cuMemFreeHost,
    cuMemHostRegister_v2,
    cuMemHostUnregister,
    cuStreamWaitEvent,
    cuEventElapsedTime_v2,
    cuMemcpyHtoDAsync_v2,
    cuMemcpyDtoHAsync_v2,
    cuMemsetD8Async,
    cuModuleLoadData,
    cuModuleGetFunction,
    cuModuleUnload,
);

pub use contexts::*;
pub use device::*;
pub use events::*;
pub use graphs::*;
pub use kernel::*;
pub use proc_address::{cuGetProcAddress, cuGetProcAddress_v2};
