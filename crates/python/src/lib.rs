//! Python bindings of tiermem: the extension module `tiermem._tiermem`, one abi3 wheel for
//! CPython 3.11 and later. The names mirror the Rust API and hold no logic of their own:
//! `Pool` is an `Engine`, `Buffer` one of its buffers (freed when collected), errors are
//! `tiermem.TiermemError` subclasses carrying the engine's message. Calls that may wait on
//! the device release the GIL.

mod allocator;
mod buffer;
mod dlpack;
mod errors;
mod pool;

use pyo3::prelude::*;

/// The C ABI (`tiermem-capi`) is linked into this shared library, which exports its `tiermem_*`
/// symbols (`nm -D`), so one library in the process owns the tiermem state:
/// `tiermem.torch.allocator` hands `_tiermem.__file__` to PyTorch, which looks up these two.
pub use tiermem_capi::{tiermem_torch_free, tiermem_torch_malloc};

/// Runs the `tiermem` program (info, demo, bench, daemon, status, top, ...) on the command line
/// `args` (the program's name first), the GIL released; `own_program` is how it starts itself
/// again for helper processes (`[sys.executable, "-m", "tiermem"]`). Returns the exit status.
#[pyfunction]
fn cli_main(py: Python<'_>, own_program: Vec<String>, args: Vec<String>) -> i32 {
    let os = |v: Vec<String>| v.into_iter().map(Into::into).collect();
    let (own_program, args) = (os(own_program), os(args));
    py.allow_threads(|| tiermem_cli::run_embedded(own_program, args))
}

/// Bytes in a size such as "16GiB" (or an int, returned as is).
#[pyfunction]
fn parse_size(size: &Bound<'_, PyAny>) -> PyResult<usize> {
    pool::size_arg("size", size)
}

#[pymodule]
fn _tiermem(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<pool::Pool>()?;
    m.add_class::<buffer::Buffer>()?;
    m.add_class::<pool::Acquisition>()?;
    m.add_function(wrap_pyfunction!(parse_size, m)?)?;
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    m.add_function(wrap_pyfunction!(allocator::set_allocator_pool, m)?)?;
    m.add_function(wrap_pyfunction!(allocator::allocator_error, m)?)?;
    m.add_function(wrap_pyfunction!(allocator::allocator_live, m)?)?;
    errors::register(m)
}
