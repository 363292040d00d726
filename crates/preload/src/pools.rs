//! Stream-ordered memory pools: which of them tiermem serves.
//!
//! `cuMemAllocAsync` allocates from the pool *current* to the stream's GPU, which is the GPU's
//! default pool unless the program made another one current (`cuDeviceSetMemPool`);
//! `cuMemAllocFromPoolAsync` names its pool. TensorFlow's and XLA's `cuda_malloc_async`
//! allocators and CuPy's `MemoryAsyncPool` allocate from the default pool by name, PyTorch's
//! `cudaMallocAsync` backend through `cuMemAllocAsync`. The default pool has no properties a
//! program relies on beyond memory of its GPU (it cannot be exported, and its allocations are
//! freed by `cuMemFreeAsync` like any), so tiermem serves its allocations as it serves
//! `cuMemAllocAsync`'s: under the budget, always mapped, freed in stream order (deferred.rs).
//!
//! A pool the program created is the driver's: its properties (a host location, shareable
//! handles for `cuMemPoolExportPointer`, access from other GPUs) are what the program asked
//! for, and tiermem's memory would not have them. Its allocations pass through, and so does
//! `cuMemAllocAsync` while such a pool is current; they are not counted against the budget.
//! `cuMemPoolTrimTo` on a default pool also gives back the HBM of tiermem's frees that are
//! done with, as the driver's pool gives back its own, and the release threshold set on it
//! (`cuMemPoolSetAttribute`, read from the driver at each quiesce point) says how much of
//! that HBM tiermem keeps across synchronizations (deferred.rs).

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;

use crate::boundary::{guard, inside, to_driver, CuResult, CUDA_ERROR_NOT_INITIALIZED, CUDA_SUCCESS};
use crate::driver::{DeviceHandle, Stream};
use crate::entry::{alloc_or, CU_STREAM_PER_THREAD};
use crate::process;
use crate::wrappers::cached_entry;

type MemPool = *mut c_void;
type GetPoolFn = unsafe extern "C" fn(*mut MemPool, DeviceHandle) -> CuResult;
type AllocFromPoolFn = unsafe extern "C" fn(*mut u64, usize, MemPool, Stream) -> CuResult;
type TrimToFn = unsafe extern "C" fn(MemPool, usize) -> CuResult;
type GetAttributeFn = unsafe extern "C" fn(MemPool, c_int, *mut c_void) -> CuResult;

/// GPU `ordinal`'s default pool (`default`) or current pool, as the driver answers.
fn ask_pool(ordinal: usize, default: bool) -> Option<MemPool> {
    static DEFAULT: OnceLock<Option<GetPoolFn>> = OnceLock::new();
    static CURRENT: OnceLock<Option<GetPoolFn>> = OnceLock::new();
    let get = match default {
        true => cached_entry(&DEFAULT, "cuDeviceGetDefaultMemPool\0")?,
        false => cached_entry(&CURRENT, "cuDeviceGetMemPool\0")?,
    };
    let mut pool = std::ptr::null_mut();
    // SAFETY: the driver's function with a valid out-pointer and a device handle (= ordinal).
    let code = unsafe { get(&mut pool, c_int::try_from(ordinal).ok()?) };
    (code == CUDA_SUCCESS).then_some(pool)
}

/// GPU `ordinal`'s default pool: asked once (it never changes), as every asynchronous
/// allocation needs it.
fn default_pool(ordinal: usize) -> Option<MemPool> {
    static KNOWN: [AtomicUsize; 64] = [const { AtomicUsize::new(0) }; 64];
    let slot = KNOWN.get(ordinal);
    if let Some(pool) = slot.map(|s| s.load(Relaxed)).filter(|&pool| pool != 0) {
        return Some(pool as MemPool);
    }
    let pool = ask_pool(ordinal, true)?;
    if let Some(slot) = slot {
        slot.store(pool as usize, Relaxed);
    }
    Some(pool)
}

/// Whether `pool` is the default pool of the calling thread's GPU (allocations from it are
/// tiermem's to serve on that GPU).
fn is_current_gpus_default(pool: MemPool) -> bool {
    let Some(Ok(ordinal)) = process::current_gpu() else { return false };
    default_pool(ordinal) == Some(pool)
}

/// Whether `cuMemAllocAsync` on the calling thread's GPU allocates from its default pool, which
/// tiermem serves; a driver that cannot say (no pools, no context) leaves that to `alloc_or`.
pub fn async_allocations_served() -> bool {
    let Some(Ok(ordinal)) = process::current_gpu() else { return true };
    match (ask_pool(ordinal, false), default_pool(ordinal)) {
        (Some(current), Some(default)) => current == default,
        _ => true,
    }
}

/// Allocates from `pool`: tiermem's memory if it is the GPU's default pool, else the driver's.
///
/// # Safety
/// As the driver's: `dptr` null or valid for a write.
unsafe fn alloc_from_pool(
    call: &str,
    real: AllocFromPoolFn,
    (dptr, size, pool): (*mut u64, usize, MemPool),
    (stream, ordered): (Stream, Stream),
) -> CuResult {
    // SAFETY: the driver's own function with the caller's arguments.
    let driver = || unsafe { real(dptr, size, pool, stream) };
    if inside() || !is_current_gpus_default(pool) {
        return to_driver(driver);
    }
    // SAFETY: the caller's out-pointer.
    unsafe { alloc_or(call, dptr, (size, Some(ordered)), driver) }
}

/// `cuMemAllocFromPoolAsync`: from the GPU's default pool, tiermem's memory (as
/// `cuMemAllocAsync`'s); from any other pool, the driver's.
///
/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut u64,
    size: usize,
    pool: MemPool,
    stream: Stream,
) -> CuResult {
    static REAL: OnceLock<Option<AllocFromPoolFn>> = OnceLock::new();
    let Some(real) = cached_entry(&REAL, "cuMemAllocFromPoolAsync\0") else { return CUDA_ERROR_NOT_INITIALIZED };
    // SAFETY: the caller's arguments.
    unsafe { alloc_from_pool("cuMemAllocFromPoolAsync", real, (dptr, size, pool), (stream, stream)) }
}

/// `cuMemAllocFromPoolAsync_ptsz`: as `cuMemAllocFromPoolAsync` (stream 0: the thread's).
///
/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut u64,
    size: usize,
    pool: MemPool,
    stream: Stream,
) -> CuResult {
    static REAL: OnceLock<Option<AllocFromPoolFn>> = OnceLock::new();
    let Some(real) = cached_entry(&REAL, "cuMemAllocFromPoolAsync_ptsz\0") else { return CUDA_ERROR_NOT_INITIALIZED };
    let ordered = if stream.is_null() { CU_STREAM_PER_THREAD } else { stream };
    // SAFETY: the caller's arguments.
    unsafe { alloc_from_pool("cuMemAllocFromPoolAsync_ptsz", real, (dptr, size, pool), (stream, ordered)) }
}

/// `cuMemPoolTrimTo`: on a GPU's default pool, tiermem's frees that are done with are given
/// back too; then the driver's.
///
/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: MemPool, keep: usize) -> CuResult {
    static REAL: OnceLock<Option<TrimToFn>> = OnceLock::new();
    let Some(real) = cached_entry(&REAL, "cuMemPoolTrimTo\0") else { return CUDA_ERROR_NOT_INITIALIZED };
    if !inside() && crate::deferred::any() {
        guard("cuMemPoolTrimTo", || {
            let gpus: Vec<usize> =
                process::managed_gpus().into_iter().filter(|&ordinal| default_pool(ordinal) == Some(pool)).collect();
            if !gpus.is_empty() {
                crate::deferred::reap(false);
                crate::deferred::trim(
                    "cuMemPoolTrimTo",
                    |ordinal| if gpus.contains(&ordinal) { keep } else { usize::MAX },
                );
            }
            CUDA_SUCCESS
        });
    }
    // SAFETY: the driver's own function with the caller's arguments.
    to_driver(|| unsafe { real(pool, keep) })
}

/// Set once tiermem serves PyTorch as its allocator (torch_alloc.rs): frees are kept across
/// synchronizations, as PyTorch's `cudaMallocAsync` backend asks of its pool.
static KEEP_ALL_FREES: AtomicBool = AtomicBool::new(false);

/// Frees are kept across synchronizations from now on, whatever the pools' thresholds say
/// (given back when an allocation needs their room, or by `cuMemPoolTrimTo`).
pub fn keep_all_frees() {
    KEEP_ALL_FREES.store(true, Relaxed);
}

/// The release threshold the program set on GPU `ordinal`'s default pool
/// (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`): how many bytes of freed memory the pool keeps at a
/// synchronization; 0 (the driver's default) where the driver cannot say; all of them once
/// [`keep_all_frees`] was called.
pub fn release_threshold(ordinal: usize) -> usize {
    if KEEP_ALL_FREES.load(Relaxed) {
        return usize::MAX;
    }
    const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: c_int = 4;
    static GET: OnceLock<Option<GetAttributeFn>> = OnceLock::new();
    let (Some(get), Some(pool)) = (cached_entry(&GET, "cuMemPoolGetAttribute\0"), default_pool(ordinal)) else {
        return 0;
    };
    let mut value: u64 = 0;
    // SAFETY: the driver's function; this attribute's value is a cuuint64_t, written to `value`.
    let code = unsafe { get(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, (&raw mut value).cast()) };
    if code == CUDA_SUCCESS {
        usize::try_from(value).unwrap_or(usize::MAX)
    } else {
        0
    }
}

/// The routed pool functions.
pub fn pool_routes() -> Vec<crate::wrappers::Route> {
    vec![
        (c"cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync as *mut c_void),
        (c"cuMemAllocFromPoolAsync_ptsz", cuMemAllocFromPoolAsync_ptsz as *mut c_void),
        (c"cuMemPoolTrimTo", cuMemPoolTrimTo as *mut c_void),
    ]
}
