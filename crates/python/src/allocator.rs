//! The C functions PyTorch's `CUDAPluggableAllocator` calls, exported by this extension so
//! that one shared library owns the process's tiermem state:
//!
//! ```c
//! void* tiermem_torch_malloc(ssize_t size, int device, cudaStream_t stream);
//! void  tiermem_torch_free(void* ptr, ssize_t size, int device, cudaStream_t stream);
//! ```
//!
//! `tiermem.torch.allocator(pool)` makes `pool` the process's allocator pool and loads these
//! from this very file (`dlopen` of an already loaded library returns the same one, so the
//! statics below are shared with Python). Each allocation is a tiermem buffer acquired for
//! writing on the allocating stream until it is freed: PyTorch may hand its address to any
//! kernel, so it must stay resident. Nothing here may unwind into PyTorch: a failure returns
//! null (PyTorch reports out-of-memory) and the engine's message is kept for
//! `tiermem.torch.allocator_error()`.

use pyo3::prelude::*;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard};
use tiermem::{Access, AllocOptions, BufferId, Engine, Region, StreamHandle};

struct State {
    engine: Option<Arc<Engine>>,
    device: usize,
    live: BTreeMap<u64, BufferId>,
    last_error: Option<String>,
}

static STATE: Mutex<State> = Mutex::new(State { engine: None, device: 0, live: BTreeMap::new(), last_error: None });

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Makes `pool` the pool that `tiermem_torch_malloc` allocates from (once per process
/// while allocations are live: PyTorch cannot switch allocators after its first allocation).
#[pyfunction]
pub fn set_allocator_pool(pool: &Bound<'_, crate::pool::Pool>) -> PyResult<()> {
    let mut s = state();
    let engine = &pool.get().engine;
    if let Some(current) = &s.engine {
        if !Arc::ptr_eq(current, engine) && !s.live.is_empty() {
            return Err(crate::errors::InvalidArgumentError::new_err(format!(
                "another Pool already backs the PyTorch allocator and holds {} live allocations",
                s.live.len()
            )));
        }
    }
    s.device = engine.device_info().ordinal;
    s.engine = Some(Arc::clone(engine));
    Ok(())
}

/// The last allocator failure's message, if any (and clears it).
#[pyfunction]
pub fn allocator_error() -> Option<String> {
    state().last_error.take()
}

/// Live allocations made through the PyTorch allocator.
#[pyfunction]
pub fn allocator_live() -> usize {
    state().live.len()
}

fn malloc(size: isize, device: i32, stream: u64) -> Result<u64, String> {
    let mut s = state();
    let engine = s.engine.clone().ok_or("no Pool is set (call tiermem.torch.allocator(pool) first)")?;
    let size = usize::try_from(size).map_err(|_| format!("size {size} is negative"))?;
    if usize::try_from(device).ok() != Some(s.device) {
        return Err(format!("device {device} asked for, but the tiermem Pool is on device {}", s.device));
    }
    let options = AllocOptions { name: Some("torch".into()), ..AllocOptions::default() };
    let (id, va) = engine.alloc(size, options).map_err(|e| e.to_string())?;
    if let Err(e) = engine.acquire(&[Region::whole(id)], Access::ReadWrite, StreamHandle(stream)) {
        let _ = engine.free(id);
        return Err(e.to_string());
    }
    s.live.insert(va, id);
    Ok(va)
}

fn free(ptr: u64, stream: u64) -> Result<(), String> {
    let mut s = state();
    let engine = s.engine.clone().ok_or("no Pool is set")?;
    let id = s.live.remove(&ptr).ok_or_else(|| format!("0x{ptr:x} was not allocated by tiermem"))?;
    let region = [Region::whole(id)];
    engine.release(&region, StreamHandle(stream)).map_err(|e| e.to_string())?;
    engine.free(id).map_err(|e| e.to_string())
}

fn record(call: &str, outcome: std::thread::Result<Result<(), String>>) {
    let message = match outcome {
        Ok(Ok(())) => return,
        Ok(Err(e)) => format!("{call}: {e}"),
        Err(_) => format!("{call}: internal error (panic)"),
    };
    eprintln!("tiermem: {message}");
    state().last_error = Some(message);
}

/// `void* f(ssize_t size, int device, cudaStream_t stream)` for `CUDAPluggableAllocator`.
#[no_mangle]
pub extern "C" fn tiermem_torch_malloc(size: isize, device: i32, stream: *mut c_void) -> *mut c_void {
    let mut ptr = 0;
    let outcome = catch_unwind(AssertUnwindSafe(|| malloc(size, device, stream as u64).map(|va| ptr = va)));
    record("tiermem_torch_malloc", outcome);
    ptr as *mut c_void
}

/// `void g(void* ptr, ssize_t size, int device, cudaStream_t stream)` for `CUDAPluggableAllocator`.
#[no_mangle]
pub extern "C" fn tiermem_torch_free(ptr: *mut c_void, _size: isize, _device: i32, stream: *mut c_void) {
    let outcome = catch_unwind(AssertUnwindSafe(|| free(ptr as u64, stream as u64)));
    record("tiermem_torch_free", outcome);
}
