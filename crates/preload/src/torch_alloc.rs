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
//! **CUDA graphs.** PyTorch gives a pluggable allocator no say in a capture's memory (its
//! caching allocator keeps a private pool per graph; a pluggable one gets plain mallocs and
//! frees on the capturing stream). A graph's replays reuse every address its capture touched,
//! so while a capture is under way anywhere in the process, a tensor is served without stream
//! ordering (no event may be recorded or queried on a capturing stream; the thread's capture
//! mode relaxed for the call, as PyTorch's own allocator does around `cudaMalloc`), and a tensor
//! made during a capture, or freed during one, is never freed nor reused: its memory stays the
//! graph's for the process's life (PyTorch would give it back when the graph is destroyed,
//! which a pluggable allocator is not told). It stays tiermem's, mapped at its address, moved
//! at quiesce points like any other.
//!
//! **Memory statistics**: counted per GPU (torch_stats.rs) for the hook to answer
//! `torch.cuda.memory_stats()` and the calls built on it.
//!
//! The signatures are PyTorch's (`CUDAPluggableAllocator`): `void* malloc(ssize_t size, int
//! device, cudaStream_t stream)` and `void free(void* ptr, ssize_t size, int device,
//! cudaStream_t stream)`; a `cudaStream_t` is the driver's `CUstream`. Neither may unwind or
//! fail silently: a refusal is `NULL` (PyTorch reports it as CUDA out of memory) with one line
//! on stderr saying why.

use std::collections::HashSet;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;

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

/// Tensors made while a capture was under way and not freed yet: kept when freed.
static CAPTURED: Mutex<Option<HashSet<u64>>> = Mutex::new(None);

fn captured() -> std::sync::MutexGuard<'static, Option<HashSet<u64>>> {
    // A set of addresses: consistent after any panic.
    CAPTURED.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
const CAPTURE_MODE_RELAXED: c_int = 2;
type ExchangeModeFn = unsafe extern "C" fn(*mut c_int) -> crate::boundary::CuResult;

/// The calling thread's stream-capture mode made relaxed until dropped, then put back: while
/// another thread captures in global mode, the driver calls an allocation makes (creating and
/// mapping chunks, querying events) would otherwise end that capture.
struct RelaxedCapture(Option<(ExchangeModeFn, c_int)>);

impl RelaxedCapture {
    fn new() -> RelaxedCapture {
        let found = crate::driver::driver().map(|d| d.symbol(c"cuThreadExchangeStreamCaptureMode"));
        let Some(exchange) = found.filter(|f| !f.is_null()) else { return RelaxedCapture(None) };
        // SAFETY: the driver's cuThreadExchangeStreamCaptureMode, of this signature.
        let exchange: ExchangeModeFn = unsafe { std::mem::transmute(exchange) };
        let mut mode = CAPTURE_MODE_RELAXED;
        // SAFETY: a valid pointer to the mode to set; the previous one is written back there.
        match unsafe { exchange(&mut mode) } {
            CUDA_SUCCESS => RelaxedCapture(Some((exchange, mode))),
            _ => RelaxedCapture(None),
        }
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        if let Some((exchange, mut before)) = self.0 {
            // SAFETY: as in new(): the mode the thread had is put back.
            unsafe { exchange(&mut before) };
        }
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
    let in_capture = crate::gate::capturing();
    let allocate = || match in_capture {
        true => {
            let _relaxed = RelaxedCapture::new();
            // SAFETY: a valid out-pointer.
            unsafe { crate::entry::cuMemAlloc_v2(&mut ptr, bytes) }
        }
        // SAFETY: a valid out-pointer; the stream is the caller's (as cuMemAllocAsync takes it).
        false => unsafe { crate::entry::cuMemAllocAsync(&mut ptr, bytes, stream as Stream) },
    };
    let Some(code) = in_context(CALL, device, true, allocate) else { return std::ptr::null_mut() };
    if code != CUDA_SUCCESS {
        log(CALL, &format!("{bytes} B on GPU {device}: CUDA error {code}"), "refused (NULL)");
        return std::ptr::null_mut();
    }
    if in_capture {
        captured().get_or_insert_with(HashSet::new).insert(ptr);
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
    let made_in_capture = captured().as_mut().is_some_and(|set| set.remove(&(ptr as u64)));
    let kept = made_in_capture || crate::gate::capturing();
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
