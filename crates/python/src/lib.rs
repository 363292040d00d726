//! Python bindings of tiermem: the extension module `tiermem._tiermem`, one abi3 wheel for
//! CPython 3.11 and later. The names mirror the Rust API and hold no logic of their own:
//! `Pool` is an `Engine`, `Buffer` one of its buffers (freed when collected), errors are
//! `tiermem.TiermemError` subclasses carrying the engine's message. Calls that may wait on
//! the device release the GIL.

mod buffer;
mod dlpack;
mod errors;
mod pool;

use pyo3::prelude::*;

#[pymodule]
fn _tiermem(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<pool::Pool>()?;
    m.add_class::<buffer::Buffer>()?;
    m.add_class::<pool::Acquisition>()?;
    errors::register(m)
}
