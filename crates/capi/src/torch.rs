//! The functions PyTorch's `CUDAPluggableAllocator` calls:
//!
//! ```c
//! void* tiermem_torch_malloc(ssize_t size, int device, cudaStream_t stream);
//! void  tiermem_torch_free(void* ptr, ssize_t size, int device, cudaStream_t stream);
//! ```
//!
//! They allocate from the process-wide engine (the Python extension installs its `Pool`'s
//! engine there in `tiermem.torch.allocator(pool)`, and exports these symbols from its own
//! shared library, so one library owns the process's tiermem state). Each allocation is a
//! tiermem buffer acquired for writing on the allocating stream until it is freed: PyTorch may
//! hand its address to any kernel, so it must stay resident.
//!
//! Their signatures have no room for a status: a failed malloc returns NULL (PyTorch reports
//! out of memory), a failed free is printed to stderr. Either way the message is kept as the
//! thread's `tiermem_last_error()` and also process-wide for [`take_torch_error`], because
//! PyTorch frees on its own threads (autograd's device threads, for one).

use crate::process;
use crate::status::{entry, Failure, TiermemStatus};
use std::ffi::c_void;
use std::io::Write;
use std::sync::Mutex;
use tiermem::{AllocOptions, StreamHandle};

static LAST_TORCH_ERROR: Mutex<Option<String>> = Mutex::new(None);

/// The last failure of the PyTorch allocator functions on any thread, cleared.
pub fn take_torch_error() -> Option<String> {
    LAST_TORCH_ERROR.lock().unwrap_or_else(|p| p.into_inner()).take()
}

/// Runs a torch entry point as `entry` does and also keeps its failure process-wide.
fn torch_entry(call: &'static str, body: impl FnOnce() -> Result<(), Failure>) -> TiermemStatus {
    let status = entry(call, body);
    if status != TiermemStatus::Ok {
        let message = crate::status::last_error_message().unwrap_or_default();
        // Not eprintln!, which panics if stderr is gone: nothing here may unwind into PyTorch.
        let _ = writeln!(std::io::stderr(), "tiermem: {message}");
        *LAST_TORCH_ERROR.lock().unwrap_or_else(|p| p.into_inner()) = Some(message);
    }
    status
}

fn malloc(size: isize, device: i32, stream: StreamHandle) -> Result<u64, Failure> {
    let engine = process::require_engine()?;
    let size = usize::try_from(size).map_err(|_| Failure::invalid(format!("size {size} is negative")))?;
    let ours = engine.device_info().ordinal;
    if usize::try_from(device).ok() != Some(ours) {
        return Err(Failure::invalid(format!(
            "device {device} asked for, but the tiermem Pool is on device {ours} (allocate on that device)"
        )));
    }
    let options = AllocOptions { name: Some("torch".into()), ..AllocOptions::default() };
    process::alloc(size, options, Some(stream))
}

/// `void* f(ssize_t size, int device, cudaStream_t stream)` for `CUDAPluggableAllocator`:
/// a resident allocation of `size` bytes, or NULL on failure.
#[no_mangle]
pub extern "C" fn tiermem_torch_malloc(size: isize, device: i32, stream: *mut c_void) -> *mut c_void {
    let mut ptr = 0;
    torch_entry("tiermem_torch_malloc", || {
        ptr = malloc(size, device, StreamHandle(stream as u64))?;
        Ok(())
    });
    ptr as *mut c_void
}

/// `void g(void* ptr, ssize_t size, int device, cudaStream_t stream)` for
/// `CUDAPluggableAllocator`: releases `ptr` once `stream`'s work is done, and frees it.
#[no_mangle]
pub extern "C" fn tiermem_torch_free(ptr: *mut c_void, size: isize, device: i32, stream: *mut c_void) {
    // The allocation's own size and device are known from `ptr`.
    let _ = (size, device);
    torch_entry("tiermem_torch_free", || process::free(ptr as u64, true, StreamHandle(stream as u64)));
}
