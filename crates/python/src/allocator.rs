//! PyTorch's `CUDAPluggableAllocator` entry points, from the C ABI crate (`tiermem-capi`).
//!
//! `tiermem_torch_malloc` / `tiermem_torch_free` live in `tiermem-capi` (crates/capi/src/torch.rs)
//! and are re-exported from the crate root (lib.rs), so this extension's shared library exports them:
//! `tiermem.torch.allocator(pool)` installs the pool's engine as the process's and hands
//! `_tiermem.__file__` to PyTorch, which loads the symbols from this very library (`dlopen` of
//! an already loaded library returns the same one, so the process state is shared with Python).

use pyo3::prelude::*;
use std::sync::Arc;

/// Makes `pool` the pool that `tiermem_torch_malloc` allocates from (once per process
/// while allocations are live: PyTorch cannot switch allocators after its first allocation).
#[pyfunction]
pub fn set_allocator_pool(pool: &Bound<'_, crate::pool::Pool>) -> PyResult<()> {
    tiermem_capi::install(Arc::clone(&pool.get().engine))
        .map_err(|failure| crate::errors::InvalidArgumentError::new_err(format!("set_allocator_pool: {failure}")))
}

/// The last allocator failure's message, on any thread, if any (and clears it).
#[pyfunction]
pub fn allocator_error() -> Option<String> {
    tiermem_capi::take_torch_error()
}

/// Live allocations made through the PyTorch allocator (and the rest of the C ABI).
#[pyfunction]
pub fn allocator_live() -> usize {
    tiermem_capi::live_allocations()
}
