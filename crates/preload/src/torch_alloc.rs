//! PyTorch's route (issue 16): the two functions of a `torch.cuda.memory.CUDAPluggableAllocator`,
//! which `tiermem run --torch-allocator` installs before the program's first CUDA allocation
//! (crates/cli/src/torch_hook.py): every tensor becomes an allocation of tiermem's, ordered on
//! the stream PyTorch names, exactly as `cuMemAllocAsync` and `cuMemFreeAsync` serve them
//! (entry.rs, deferred.rs): always mapped, in HBM up to the budget and beyond it in a lending
//! neighbour's HBM or on the host, a free taken back by the next allocation of its size on its
//! stream, the books and the migration those of the driver route.
//!
//! What it gives the policy over the driver route: tiermem sees each tensor and each free, where
//! it otherwise sees PyTorch's segments of many tensors and none of their frees.
//! What it costs: PyTorch's caching allocator is gone, so each tensor is a mapping of its own
//! and moving many small ones costs more driver calls (docs/transparent.md, "The PyTorch route").
//!
//! **CUDA graphs**: PyTorch gives a pluggable allocator no private graph pool; what a capture
//! makes or frees stays the graph's (captures.rs, as for any stream-ordered allocation).
//!
//! **Memory statistics**: counted per GPU (torch_stats.rs) for the hook to answer
//! `torch.cuda.memory_stats()` and the calls built on it.
//!
//! The signatures are PyTorch's (`CUDAPluggableAllocator`): `void* malloc(ssize_t size, int
//! device, cudaStream_t stream)` and `void free(void* ptr, ssize_t size, int device,
//! cudaStream_t stream)`; a `cudaStream_t` is the driver's `CUstream`. Neither may unwind or
//! fail silently: a refusal is `NULL` (PyTorch reports it as CUDA out of memory) with one line
//! on stderr saying why.

use std::ffi::{c_int, c_void};

use crate::boundary::{log, CUDA_SUCCESS};

/// `CUDA_ERROR_DEINITIALIZED`: the driver is shutting down.
const CUDA_ERROR_DEINITIALIZED: crate::boundary::CuResult = 4;
use crate::driver::{PrimaryContext, Stream};

/// Runs `body` in GPU `device`'s context: the calling thread's current one when it is that
/// GPU's; the GPU's primary context (the runtime's), bound for the call, when the thread has
/// none yet (PyTorch's autograd threads allocate before the runtime made a context current
/// there, as it does lazily at its next call). When another GPU's is current, `strict` (an
/// allocation, which lands on the current GPU) refuses it, said: PyTorch makes the tensor's
/// device current before it allocates; a free goes on (it finds its allocation by address).
fn in_context<T>(call: &str, device: c_int, strict: bool, body: impl FnOnce() -> T) -> Option<T> {
    let Ok(ordinal) = usize::try_from(device) else {
        log(call, &format!("GPU {device}"), "refused");
        return None;
    };
    match crate::process::current_gpu() {
        Some(Ok(current)) if current != ordinal && strict => {
            log(call, &format!("asked for GPU {device} while GPU {current}'s context is current"), "refused");
            None
        }
        // The driver shut down (a program exiting): nothing to serve, nothing to say.
        Some(Err(CUDA_ERROR_DEINITIALIZED)) => None,
        Some(Err(_)) => match PrimaryContext::bind(ordinal) {
            Ok(_bound) => Some(body()),
            Err(why) => {
                log(call, &format!("no context is current and {why}"), "refused");
                None
            }
        },
        _ => Some(body()),
    }
}

/// `CUDAPluggableAllocator`'s malloc: `size` bytes on GPU `device`, ordered on `stream`; `NULL`
/// when refused (PyTorch's out-of-memory error follows).
///
/// # Safety
/// As PyTorch calls it: `stream` a stream of `device`'s current context (or null).
#[no_mangle]
pub unsafe extern "C" fn tiermem_torch_malloc(size: isize, device: c_int, stream: *mut c_void) -> *mut c_void {
    const CALL: &str = "tiermem_torch_malloc";
    let Ok(bytes) = usize::try_from(size) else {
        log(CALL, &format!("a size of {size} B"), "refused (NULL)");
        return std::ptr::null_mut();
    };
    if bytes == 0 {
        return std::ptr::null_mut();
    }
    // PyTorch's own stream-ordered backend keeps every free in its pool across synchronizations
    // (a release threshold of all): so does tiermem for it, or each step would make its tensors'
    // chunks anew.
    crate::pools::keep_all_frees();
    let mut ptr = 0u64;
    // SAFETY: a valid out-pointer; the stream is the caller's (as cuMemAllocAsync takes it).
    let allocate = || unsafe { crate::entry::cuMemAllocAsync(&mut ptr, bytes, stream as Stream) };
    let Some(code) = in_context(CALL, device, true, allocate) else { return std::ptr::null_mut() };
    if code != CUDA_SUCCESS {
        log(CALL, &format!("{bytes} B on GPU {device}: CUDA error {code}"), "refused (NULL)");
        return std::ptr::null_mut();
    }
    crate::torch_stats::allocated(device, bytes as u64);
    ptr as *mut c_void
}

/// `CUDAPluggableAllocator`'s free: `ptr` (from [`tiermem_torch_malloc`]) given back once
/// `stream`'s work before it is done.
///
/// # Safety
/// As PyTorch calls it: `ptr` an allocation of [`tiermem_torch_malloc`] not freed since.
#[no_mangle]
pub unsafe extern "C" fn tiermem_torch_free(ptr: *mut c_void, size: isize, device: c_int, stream: *mut c_void) {
    if ptr.is_null() {
        return;
    }
    // A capture's tensor, or one freed while a capture is under way: the graph's for good.
    let kept = crate::captures::keeps(ptr as u64);
    crate::torch_stats::freed(device, u64::try_from(size).unwrap_or(0), kept);
    if kept {
        return;
    }
    // SAFETY: the caller's pointer and stream, as cuMemFreeAsync takes them.
    let release = || unsafe { crate::entry::cuMemFreeAsync(ptr as u64, stream as Stream) };
    let Some(code) = in_context("tiermem_torch_free", device, false, release) else { return };
    if code != CUDA_SUCCESS {
        log(
            "tiermem_torch_free",
            &format!("{ptr:p} on GPU {device}: CUDA error {code}"),
            "its memory stays held (a pointer freed twice, or not tiermem's?)",
        );
    }
}

/// `torch.cuda.empty_cache()` (the hook routes it here; a pluggable allocator has no cache of
/// PyTorch's to empty): the memory of freed tensors that tiermem keeps for reuse (deferred.rs)
/// goes back to the driver, after their streams' work is done — as PyTorch's own allocator
/// waits for its events — so that other programs, and the node daemon's other tenants, get it.
/// Nothing while a capture is under way (the graph's memory stays, captures.rs). 0, or the CUDA
/// error of a failure (said on stderr; the memory stays held).
#[no_mangle]
pub extern "C" fn tiermem_torch_empty_cache() -> c_int {
    const CALL: &str = "torch.cuda.empty_cache";
    if crate::gate::capturing() {
        return 0;
    }
    crate::boundary::guard(CALL, || {
        crate::deferred::reap(true);
        crate::deferred::trim(CALL, |_| 0);
        CUDA_SUCCESS
    }) as c_int
}
