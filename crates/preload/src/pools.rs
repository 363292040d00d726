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
//! A pool the program creates (`cuMemPoolCreate`; RAPIDS' `cuda_async_memory_resource` makes
//! one) is served the same way when it asks for nothing tiermem's memory lacks: pinned memory
//! of a GPU tiermem manages, no shareable handles (`cuMemPoolExportPointer` needs them), no
//! size limit, no special usage ([`served_properties`]). Access from other GPUs needs nothing:
//! tiermem opens its allocations to every GPU of the process that can reach them (peers.rs).
//! Any other created pool is the driver's: its allocations pass through, and so does
//! `cuMemAllocAsync` while such a pool is current; they are not counted against the budget.
//! `cuMemPoolTrimTo` on a served pool also gives back the HBM of tiermem's frees that are
//! done with, as the driver's pool gives back its own, and the release thresholds set on the
//! served pools of a GPU (`cuMemPoolSetAttribute`, read from the driver at each quiesce point;
//! the largest counts) say how much of that HBM tiermem keeps across synchronizations
//! (deferred.rs: tiermem's kept frees are the GPU's, not one pool's).

use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::boundary::{guard_step, inside, to_driver, CuResult, CUDA_ERROR_NOT_INITIALIZED, CUDA_SUCCESS};
use crate::driver::{DeviceHandle, Stream};
use crate::entry::{alloc_or, CU_STREAM_PER_THREAD};
use crate::process;
use crate::wrappers::{cached_entry, wrappers};

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

/// `CUmemPoolProps`: 88 bytes in every CUDA release since 11.2 (`maxSize` and `usage` were
/// reserved bytes, zero, before 12.2).
#[repr(C)]
pub struct PoolProps {
    alloc_type: c_int,
    handle_types: c_int,
    location_type: c_int,
    location_id: c_int,
    win32_security_attributes: *mut c_void,
    max_size: usize,
    usage: u16,
    reserved: [u8; 54],
}

/// The GPU a pool with `props` holds memory of, if tiermem serves such a pool (module
/// documentation): pinned, on a GPU, no shareable handles, no size limit, no special usage.
fn served_properties(props: &PoolProps) -> Option<usize> {
    const PINNED: c_int = 1;
    const DEVICE: c_int = 1;
    let plain = props.alloc_type == PINNED && props.location_type == DEVICE && props.handle_types == 0;
    (plain && props.max_size == 0 && props.usage == 0).then(|| usize::try_from(props.location_id).ok()).flatten()
}

/// The pools the program created that tiermem serves, and their GPUs.
static CREATED: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());

fn created() -> MutexGuard<'static, BTreeMap<usize, usize>> {
    // A map of addresses: consistent after any panic.
    CREATED.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Whether tiermem serves `pool`'s allocations on GPU `ordinal`: its default pool, or one the
/// program created that tiermem serves there.
fn serves(pool: MemPool, ordinal: usize) -> bool {
    default_pool(ordinal) == Some(pool) || created().get(&(pool as usize)) == Some(&ordinal)
}

/// The pools tiermem serves on GPU `ordinal`: its default one and those the program created.
fn served_pools(ordinal: usize) -> Vec<MemPool> {
    let mut pools: Vec<MemPool> = default_pool(ordinal).into_iter().collect();
    pools.extend(created().iter().filter(|&(_, &gpu)| gpu == ordinal).map(|(&pool, _)| pool as MemPool));
    pools
}

/// The GPU on which tiermem serves `pool`, if it does.
fn served_gpu(pool: MemPool) -> Option<usize> {
    if let Some(&ordinal) = created().get(&(pool as usize)) {
        return Some(ordinal);
    }
    process::managed_gpus().into_iter().find(|&ordinal| default_pool(ordinal) == Some(pool))
}

/// Whether `pool` is served on the calling thread's GPU (allocations from it are tiermem's).
fn is_served_here(pool: MemPool) -> bool {
    let Some(Ok(ordinal)) = process::current_gpu() else { return false };
    serves(pool, ordinal)
}

/// Whether `cuMemAllocAsync` on the calling thread's GPU allocates from a pool tiermem serves
/// (its default pool, unless the program made another current); a driver that cannot say (no
/// pools, no context) leaves that to `alloc_or`.
pub fn async_allocations_served() -> bool {
    let Some(Ok(ordinal)) = process::current_gpu() else { return true };
    ask_pool(ordinal, false).is_none_or(|current| serves(current, ordinal))
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
    if inside() || !is_served_here(pool) {
        return to_driver(driver);
    }
    // SAFETY: the caller's out-pointer.
    unsafe { alloc_or(call, dptr, (size, Some(ordered)), driver) }
}

/// `cuMemAllocFromPoolAsync`: from a pool tiermem serves, tiermem's memory (as
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

/// `cuMemPoolTrimTo`: on a pool tiermem serves, tiermem's frees that are done with are given
/// back too; then the driver's.
///
/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: MemPool, keep: usize) -> CuResult {
    static REAL: OnceLock<Option<TrimToFn>> = OnceLock::new();
    let Some(real) = cached_entry(&REAL, "cuMemPoolTrimTo\0") else { return CUDA_ERROR_NOT_INITIALIZED };
    if !inside() && crate::deferred::any() {
        guard_step("cuMemPoolTrimTo", || {
            let gpus: Vec<usize> =
                process::managed_gpus().into_iter().filter(|&ordinal| serves(pool, ordinal)).collect();
            if !gpus.is_empty() {
                crate::deferred::reap(false);
                crate::deferred::trim(
                    "cuMemPoolTrimTo",
                    |ordinal| if gpus.contains(&ordinal) { keep } else { usize::MAX },
                );
            }
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

/// The release threshold the program set on the pools tiermem serves on GPU `ordinal`
/// (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`), the largest: how many bytes of freed memory the pools
/// keep at a synchronization; 0 (the driver's default) where the driver cannot say; all of
/// them once [`keep_all_frees`] was called.
pub fn release_threshold(ordinal: usize) -> usize {
    if KEEP_ALL_FREES.load(Relaxed) {
        return usize::MAX;
    }
    const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: c_int = 4;
    static GET: OnceLock<Option<GetAttributeFn>> = OnceLock::new();
    let Some(get) = cached_entry(&GET, "cuMemPoolGetAttribute\0") else { return 0 };
    let threshold = |pool: MemPool| {
        let mut value: u64 = 0;
        // SAFETY: the driver's function; this attribute's value is a cuuint64_t, written to `value`.
        let code = unsafe { get(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, (&raw mut value).cast()) };
        if code == CUDA_SUCCESS {
            usize::try_from(value).unwrap_or(usize::MAX)
        } else {
            0
        }
    };
    served_pools(ordinal).into_iter().map(threshold).max().unwrap_or(0)
}

/// `cuMemPoolGetAttribute` answered: for a pool tiermem serves, tiermem's memory added to its
/// statistics (pool_stats.rs).
fn attribute_read(
    name: &'static str,
    call: impl FnOnce() -> CuResult,
    pool: MemPool,
    attribute: c_int,
    value: *mut c_void,
) -> CuResult {
    let code = to_driver(call);
    if code == CUDA_SUCCESS && !inside() {
        guard_step(name, || {
            if let Some(ordinal) = served_gpu(pool) {
                // SAFETY: the driver accepted `value` for this attribute and wrote it.
                unsafe { crate::pool_stats::add_ours(ordinal, attribute, value) };
            }
        });
    }
    code
}

/// `cuMemPoolSetAttribute` done: resetting a high-water mark of a pool tiermem serves resets
/// tiermem's too (pool_stats.rs).
fn attribute_written(name: &'static str, call: impl FnOnce() -> CuResult, pool: MemPool, attribute: c_int) -> CuResult {
    let code = to_driver(call);
    if code == CUDA_SUCCESS && !inside() {
        guard_step(name, || {
            if let Some(ordinal) = served_gpu(pool) {
                crate::pool_stats::reset(ordinal, attribute);
            }
        });
    }
    code
}

wrappers! { attribute_routes:
    cuMemPoolGetAttribute(pool: MemPool, attribute: c_int, value: *mut c_void) => attribute_read(pool, attribute, value);
    cuMemPoolSetAttribute(pool: MemPool, attribute: c_int, value: *mut c_void) => attribute_written(pool, attribute);
}

type PoolCreateFn = unsafe extern "C" fn(*mut MemPool, *const PoolProps) -> CuResult;
type PoolDestroyFn = unsafe extern "C" fn(MemPool) -> CuResult;

/// `cuMemPoolCreate`: the driver's pool; served by tiermem if its properties allow (module
/// documentation).
///
/// # Safety
/// As the driver's: `pool` null or valid for a write, `props` null or a `CUmemPoolProps`.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(pool: *mut MemPool, props: *const PoolProps) -> CuResult {
    static REAL: OnceLock<Option<PoolCreateFn>> = OnceLock::new();
    let Some(real) = cached_entry(&REAL, "cuMemPoolCreate\0") else { return CUDA_ERROR_NOT_INITIALIZED };
    // SAFETY: the driver's own function with the caller's arguments.
    let code = to_driver(|| unsafe { real(pool, props) });
    if code == CUDA_SUCCESS && !inside() && !pool.is_null() && !props.is_null() {
        // SAFETY: the driver read the properties and wrote the pool's handle: both valid.
        let (made, ordinal) = unsafe { (*pool, served_properties(&*props)) };
        if let Some(ordinal) = ordinal {
            created().insert(made as usize, ordinal);
        }
    }
    code
}

/// `cuMemPoolDestroy`: served no more. (Its allocations not yet freed stay tiermem's until they
/// are, as the driver keeps a destroyed pool's until theirs are.)
///
/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: MemPool) -> CuResult {
    static REAL: OnceLock<Option<PoolDestroyFn>> = OnceLock::new();
    let Some(real) = cached_entry(&REAL, "cuMemPoolDestroy\0") else { return CUDA_ERROR_NOT_INITIALIZED };
    // SAFETY: the driver's own function with the caller's argument.
    let code = to_driver(|| unsafe { real(pool) });
    if code == CUDA_SUCCESS && !inside() {
        created().remove(&(pool as usize));
    }
    code
}

/// The routed pool functions.
pub fn pool_routes() -> Vec<crate::wrappers::Route> {
    vec![
        (c"cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync as *mut c_void),
        (c"cuMemAllocFromPoolAsync_ptsz", cuMemAllocFromPoolAsync_ptsz as *mut c_void),
        (c"cuMemPoolTrimTo", cuMemPoolTrimTo as *mut c_void),
        (c"cuMemPoolCreate", cuMemPoolCreate as *mut c_void),
        (c"cuMemPoolDestroy", cuMemPoolDestroy as *mut c_void),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(handle_types: c_int, location_type: c_int, max_size: usize) -> PoolProps {
        PoolProps {
            alloc_type: 1,
            handle_types,
            location_type,
            location_id: 3,
            win32_security_attributes: std::ptr::null_mut(),
            max_size,
            usage: 0,
            reserved: [0; 54],
        }
    }

    #[test]
    fn only_plain_pools_of_a_gpu_are_served() {
        assert_eq!(std::mem::size_of::<PoolProps>(), 88, "CUmemPoolProps");
        assert_eq!(served_properties(&props(0, 1, 0)), Some(3), "pinned memory of GPU 3, nothing else asked");
        assert_eq!(served_properties(&props(1, 1, 0)), None, "shareable handles (POSIX fds)");
        assert_eq!(served_properties(&props(0, 1, 1 << 30)), None, "a size limit");
        assert_eq!(served_properties(&props(0, 3, 0)), None, "host NUMA memory");
        assert_eq!(served_properties(&PoolProps { usage: 2, ..props(0, 1, 0) }), None, "hardware decompression");
        assert_eq!(served_properties(&PoolProps { alloc_type: 0, ..props(0, 1, 0) }), None, "an invalid type");
    }
}
