//! Stream-ordered memory pools, as far as the fake goes: the GPU's default pool, pools a
//! program creates, the pool current to the GPU (`cuDeviceSetMemPool`), allocations from a
//! pool (plain memory, as `cuMemAllocAsync`'s), the release threshold (the one attribute
//! kept) and trims, which are counted for tests (`tiermem_fake_pool_trims`). A pool has no memory of its own: freeing goes through
//! `cuMemFreeAsync`, as with the driver.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

use crate::*;

/// The one GPU's default pool: any non-null handle the program cannot mistake.
const DEFAULT_POOL: u64 = 0x7e57_9000;

/// Pools created and not destroyed; the pool current to the GPU (0: the default one).
static CREATED: Mutex<BTreeSet<u64>> = Mutex::new(BTreeSet::new());
static NEXT: AtomicU64 = AtomicU64::new(DEFAULT_POOL + 1);
static CURRENT_POOL: AtomicU64 = AtomicU64::new(0);
static TRIMS: AtomicUsize = AtomicUsize::new(0);

fn created() -> std::sync::MutexGuard<'static, BTreeSet<u64>> {
    CREATED.lock().unwrap_or_else(|p| p.into_inner())
}

fn known(pool: *mut c_void) -> bool {
    let pool = pool as u64;
    pool == DEFAULT_POOL || created().contains(&pool)
}

/// # Safety
/// As the driver's: `pool` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(pool: *mut *mut c_void, device: c_int) -> Code {
    if device != 0 {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    // SAFETY: the caller's out-pointer.
    unsafe { put(pool, DEFAULT_POOL as usize as *mut c_void) }
}

/// # Safety
/// As the driver's: `pool` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut *mut c_void, device: c_int) -> Code {
    if device != 0 {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    let current = match CURRENT_POOL.load(Relaxed) {
        0 => DEFAULT_POOL,
        pool => pool,
    };
    // SAFETY: the caller's out-pointer.
    unsafe { put(pool, current as usize as *mut c_void) }
}

#[no_mangle]
pub extern "C" fn cuDeviceSetMemPool(device: c_int, pool: *mut c_void) -> Code {
    if device != 0 {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    if !known(pool) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    CURRENT_POOL.store(pool as u64, Relaxed);
    CUDA_SUCCESS
}

/// # Safety
/// As the driver's: `pool` null or valid for a write; the properties are not read.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(pool: *mut *mut c_void, props: *const c_void) -> Code {
    if props.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let handle = NEXT.fetch_add(1, Relaxed);
    created().insert(handle);
    // SAFETY: the caller's out-pointer.
    unsafe { put(pool, handle as usize as *mut c_void) }
}

#[no_mangle]
pub extern "C" fn cuMemPoolDestroy(pool: *mut c_void) -> Code {
    if !created().remove(&(pool as u64)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let _ = CURRENT_POOL.compare_exchange(pool as u64, 0, Relaxed, Relaxed);
    CUDA_SUCCESS
}

#[no_mangle]
pub extern "C" fn cuMemPoolTrimTo(pool: *mut c_void, _keep: usize) -> Code {
    if !known(pool) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    TRIMS.fetch_add(1, Relaxed);
    CUDA_SUCCESS
}

/// # Safety
/// As the driver's: `ptr` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    ptr: *mut u64,
    size: usize,
    pool: *mut c_void,
    _s: *mut c_void,
) -> Code {
    if !known(pool) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the caller's out-pointer.
    unsafe { alloc_plain(ptr, size) }
}

/// # Safety
/// As the driver's: `ptr` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    ptr: *mut u64,
    size: usize,
    pool: *mut c_void,
    stream: *mut c_void,
) -> Code {
    // SAFETY: passed on from the caller.
    unsafe { cuMemAllocFromPoolAsync(ptr, size, pool, stream) }
}

/// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`, the one attribute the fake keeps (per pool).
const RELEASE_THRESHOLD: c_int = 4;
/// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` … `USED_MEM_HIGH`: the fake's pools hold no memory of
/// their own (their allocations are plain ones), so these read 0; the high-water marks may be
/// reset (set to 0) as the driver's.
const STATISTICS: std::ops::RangeInclusive<c_int> = 5..=8;
static THRESHOLDS: Mutex<BTreeMap<u64, u64>> = Mutex::new(BTreeMap::new());

/// # Safety
/// As the driver's: `value` valid for the attribute's type (a `cuuint64_t` for the threshold).
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(pool: *mut c_void, attribute: c_int, value: *mut c_void) -> Code {
    if !known(pool) || value.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null; the threshold's and the marks' values are cuuint64_t.
    let given = unsafe { value.cast::<u64>().read() };
    match attribute {
        RELEASE_THRESHOLD => {}
        6 | 8 if given == 0 => return CUDA_SUCCESS,
        _ => return CUDA_ERROR_INVALID_VALUE,
    }
    let threshold = given;
    THRESHOLDS.lock().unwrap_or_else(|p| p.into_inner()).insert(pool as u64, threshold);
    CUDA_SUCCESS
}

/// # Safety
/// As the driver's: `value` valid for a write of the attribute's type.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAttribute(pool: *mut c_void, attribute: c_int, value: *mut c_void) -> Code {
    if !known(pool) || (attribute != RELEASE_THRESHOLD && !STATISTICS.contains(&attribute)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if attribute != RELEASE_THRESHOLD {
        // SAFETY: the caller's out-pointer, for a cuuint64_t.
        return unsafe { put(value.cast::<u64>(), 0) };
    }
    let threshold = THRESHOLDS.lock().unwrap_or_else(|p| p.into_inner()).get(&(pool as u64)).copied().unwrap_or(0);
    // SAFETY: the caller's out-pointer, for a cuuint64_t.
    unsafe { put(value.cast::<u64>(), threshold) }
}

/// How many times `cuMemPoolTrimTo` was called (a test's view of what reached the driver).
#[no_mangle]
pub extern "C" fn tiermem_fake_pool_trims() -> usize {
    TRIMS.load(Relaxed)
}
