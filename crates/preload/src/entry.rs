//! The routed driver entry points: tiermem's versions of the memory calls, exported under the
//! driver's versioned names (a program linked against libcuda calls these directly) and handed
//! out by the `dlsym` and `cuGetProcAddress` overrides (routes.rs).
//!
//! Each one gives the driver the calls tiermem does not serve, so that their answer is the
//! driver's own: a null out-pointer, a size of zero, a pitch allocation the driver would
//! refuse, a pointer tiermem did not allocate (a second free, a pointer never allocated), a
//! GPU tiermem could not open, and every call on a thread already inside tiermem.

use std::ffi::c_uint;

use crate::boundary::{guard, guard_step, inside, to_driver, CuResult, CUDA_ERROR_NOT_INITIALIZED, CUDA_SUCCESS};
use crate::driver::{driver, Driver, Stream};
use crate::process::{self, Drain, Served};

/// `CU_STREAM_PER_THREAD`: what stream 0 means to a `_ptsz` entry point.
pub(crate) const CU_STREAM_PER_THREAD: Stream = 0x2 as Stream;

/// The driver's function `$field`, or `CUDA_ERROR_NOT_INITIALIZED` from the enclosing wrapper
/// when there is no driver (no program could have reached a wrapper through it then).
macro_rules! real {
    ($field:ident) => {
        match driver().and_then(|d: &'static Driver| d.$field) {
            Some(f) => f,
            None => return CUDA_ERROR_NOT_INITIALIZED,
        }
    };
}

/// Allocates through tiermem, or passes to `fallback` (the driver) what tiermem leaves to it.
///
/// # Safety
/// `dptr` must be null or valid for a write.
pub(crate) unsafe fn alloc_or(
    call: &str,
    dptr: *mut u64,
    (size, stream): (usize, Option<Stream>),
    fallback: impl FnOnce() -> CuResult,
) -> CuResult {
    if inside() || dptr.is_null() || size == 0 {
        return to_driver(fallback);
    }
    if stream.is_some() && crate::gate::capturing() {
        // SAFETY: checked non-null; the caller's out-pointer.
        return unsafe { crate::captures::alloc(call, dptr, size) };
    }
    // SAFETY: checked non-null; the caller's out-pointer.
    unsafe { serve(call, (size, stream), dptr, fallback, |ptr| *dptr = ptr) }
}

/// Carries out what `process::alloc` decides for `size` bytes: tiermem's pointer handed over by
/// `hand_over`, or the driver's allocation made by `driver` (a small one counted against the
/// budget, placement.rs).
///
/// # Safety
/// `dptr` non-null and valid for reads: the driver writes the pointer there on success.
unsafe fn serve(
    call: &str,
    (size, stream): (usize, Option<Stream>),
    dptr: *mut u64,
    driver: impl FnOnce() -> CuResult,
    hand_over: impl FnOnce(u64),
) -> CuResult {
    let code = guard(call, || match process::alloc(call, size, stream) {
        Ok(Served::Tiermem(ptr)) => {
            hand_over(ptr);
            CUDA_SUCCESS
        }
        Ok(Served::Driver) => driver(),
        Ok(Served::DriverCounted { ordinal, bytes }) => {
            let code = driver();
            // SAFETY: non-null (the caller's contract); the driver wrote the pointer on success.
            let made = (code == CUDA_SUCCESS).then(|| unsafe { *dptr });
            process::driver_allocated(ordinal, bytes, made);
            code
        }
        Err(code) => code,
    });
    if code == CUDA_SUCCESS {
        // SAFETY: non-null (the caller's contract), written on success.
        let ptr = unsafe { *dptr };
        match stream {
            // Stream-ordered memory is its pool's (counted in the pool's statistics), the rest
            // the context's.
            Some(_) => crate::pool_stats::allocated(ptr),
            None => crate::contexts::allocated(ptr),
        }
    }
    code
}

/// Frees through tiermem, or passes the pointer to `fallback` (the driver).
fn free_or(call: &str, ptr: u64, drain: Drain, fallback: impl FnOnce() -> CuResult) -> CuResult {
    if inside() {
        return to_driver(fallback);
    }
    crate::contexts::freed(ptr);
    if crate::captures::keeps(ptr) {
        return CUDA_SUCCESS; // a CUDA graph's (captures.rs)
    }
    guard(call, || match process::free(call, ptr, drain) {
        Some(code) => {
            if code == CUDA_SUCCESS {
                crate::pool_stats::freed(ptr);
            }
            code
        }
        None => {
            // Out of the books before the driver frees it: the driver may hand the address
            // to another thread's allocation the moment it is free.
            let taken = process::take_driver_allocation(ptr);
            let code = fallback();
            process::driver_free_done(taken, code == CUDA_SUCCESS);
            code
        }
    })
}

/// `cuMemAlloc_v2`: a mapped allocation under the budget.
///
/// # Safety
/// As the driver's: `dptr` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut u64, size: usize) -> CuResult {
    let real = real!(mem_alloc);
    // SAFETY: the caller's arguments, as the driver takes them.
    unsafe { alloc_or("cuMemAlloc_v2", dptr, (size, None), || real(dptr, size)) }
}

/// `cuMemAllocPitch_v2`: rows of `width` bytes padded to 512 (what the driver gives on the
/// GPUs we know; the contract is only that the pitch is at least the width).
///
/// # Safety
/// As the driver's: out-pointers null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut u64,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: c_uint,
) -> CuResult {
    const PITCH_ALIGNMENT: usize = 512;
    let real = real!(mem_alloc_pitch);
    // SAFETY: the caller's arguments, as the driver takes them.
    let driver = || to_driver(|| unsafe { real(dptr, pitch, width, height, element_size) });
    let padded = width.checked_next_multiple_of(PITCH_ALIGNMENT);
    let size = padded.and_then(|padded| padded.checked_mul(height));
    let valid = !pitch.is_null() && !dptr.is_null() && matches!(element_size, 4 | 8 | 16);
    let (Some(padded), Some(size)) = (padded, size) else { return driver() };
    if inside() || !valid || size == 0 {
        return driver();
    }
    // SAFETY: both checked non-null; the caller's out-pointers.
    unsafe { serve("cuMemAllocPitch_v2", (size, None), dptr, driver, |ptr| (*dptr, *pitch) = (ptr, padded)) }
}

/// `cuMemFree_v2`: waits for the context, then unmaps.
///
/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(ptr: u64) -> CuResult {
    let real = real!(mem_free);
    // SAFETY: the driver's own function with the caller's argument.
    free_or("cuMemFree_v2", ptr, Drain::Context, || unsafe { real(ptr) })
}

/// `cuMemGetInfo_v2`: the budget, and what of it tiermem's allocations leave free.
///
/// # Safety
/// As the driver's: out-pointers null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CuResult {
    let real = real!(mem_get_info);
    // SAFETY: the driver's own function with the caller's arguments.
    let driver = || to_driver(|| unsafe { real(free, total) });
    if inside() || free.is_null() || total.is_null() {
        return driver();
    }
    guard("cuMemGetInfo_v2", || match process::mem_info("cuMemGetInfo_v2") {
        Some(Ok((budget_free, budget))) => {
            // SAFETY: checked non-null; the caller's out-pointers.
            unsafe { (*free, *total) = (budget_free, budget) };
            CUDA_SUCCESS
        }
        Some(Err(code)) => code,
        None => driver(),
    })
}

/// `cuMemAllocAsync`: the memory is mapped before the call returns, so it is ready for work
/// on `stream` (and on any other) at once. While the program has made a pool of its own current
/// to the GPU, the driver's (pools.rs).
///
/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(dptr: *mut u64, size: usize, stream: Stream) -> CuResult {
    let real = real!(mem_alloc_async);
    if !crate::pools::async_allocations_served() {
        // SAFETY: the driver's own function with the caller's arguments.
        return to_driver(|| unsafe { real(dptr, size, stream) });
    }
    // SAFETY: the caller's arguments, as the driver takes them.
    unsafe { alloc_or("cuMemAllocAsync", dptr, (size, Some(stream)), || real(dptr, size, stream)) }
}

/// `cuMemAllocAsync_ptsz`: as `cuMemAllocAsync`.
///
/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(dptr: *mut u64, size: usize, stream: Stream) -> CuResult {
    let real = real!(mem_alloc_async_ptsz);
    if !crate::pools::async_allocations_served() {
        // SAFETY: the driver's own function with the caller's arguments.
        return to_driver(|| unsafe { real(dptr, size, stream) });
    }
    // Stream 0 of a `_ptsz` call is the thread's: reuse matches frees ordered on it (deferred.rs).
    let ordered = if stream.is_null() { CU_STREAM_PER_THREAD } else { stream };
    // SAFETY: the caller's arguments, as the driver takes them.
    unsafe { alloc_or("cuMemAllocAsync_ptsz", dptr, (size, Some(ordered)), || real(dptr, size, stream)) }
}

/// `cuMemFreeAsync`: ordered on `stream` by an event, kept mapped for reuse (deferred.rs).
///
/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(ptr: u64, stream: Stream) -> CuResult {
    let real = real!(mem_free_async);
    // SAFETY: the driver's own function with the caller's arguments.
    free_or("cuMemFreeAsync", ptr, Drain::Stream(stream), || unsafe { real(ptr, stream) })
}

/// `cuMemFreeAsync_ptsz`: as `cuMemFreeAsync` (stream 0: the thread's default stream).
///
/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(ptr: u64, stream: Stream) -> CuResult {
    let real = real!(mem_free_async_ptsz);
    let drained = if stream.is_null() { CU_STREAM_PER_THREAD } else { stream };
    // SAFETY: the driver's own function with the caller's arguments.
    free_or("cuMemFreeAsync_ptsz", ptr, Drain::Stream(drained), || unsafe { real(ptr, stream) })
}

/// `cuMemAllocManaged`: the driver's, counted (never moved: the driver migrates it already).
///
/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(dptr: *mut u64, size: usize, flags: c_uint) -> CuResult {
    let real = real!(mem_alloc_managed);
    // SAFETY: the driver's own function with the caller's arguments.
    let code = to_driver(|| unsafe { real(dptr, size, flags) });
    if code == CUDA_SUCCESS && !inside() && !dptr.is_null() {
        // SAFETY: the driver wrote the pointer it succeeded with.
        let ptr = unsafe { *dptr };
        crate::contexts::allocated(ptr);
        guard_step("cuMemAllocManaged", || {
            process::managed_allocated(ptr, size);
        });
    }
    code
}
