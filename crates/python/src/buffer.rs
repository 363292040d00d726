use crate::errors::{to_py, BufferStateError, InvalidArgumentError};
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tiermem::{BufferId, Engine};

/// A tiermem buffer: `size` bytes at the device address `ptr`, valid until `free()` or until
/// the object is collected. Its chunks move between tiers; acquire it before device work.
#[pyclass(module = "tiermem", frozen)]
pub struct Buffer {
    pub(crate) engine: Arc<Engine>,
    pub(crate) id: BufferId,
    ptr: u64,
    size: usize,
    name: Option<String>,
    freed: AtomicBool,
}

impl Buffer {
    pub fn new(engine: Arc<Engine>, id: BufferId, ptr: u64, size: usize, name: Option<String>) -> Self {
        Self { engine, id, ptr, size, name, freed: AtomicBool::new(false) }
    }
}

#[pymethods]
impl Buffer {
    /// The device address, stable for the buffer's whole life.
    #[getter]
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    #[getter]
    pub fn size(&self) -> usize {
        self.size
    }

    #[getter]
    fn id(&self) -> u64 {
        self.id.0
    }

    #[getter]
    fn name(&self) -> Option<String> {
        self.name.clone()
    }

    fn __len__(&self) -> usize {
        self.size
    }

    fn __repr__(&self) -> String {
        let name = self.name.as_deref().map_or(String::new(), |n| format!(" {n:?}"));
        format!("<tiermem.Buffer {}{name} {} bytes at 0x{:x}>", self.id, self.size, self.ptr)
    }

    /// Writes `data` at `offset` from host memory (the buffer becomes resident). `data` is
    /// any C-contiguous object with the buffer protocol and byte items (`bytes`, `bytearray`,
    /// a `memoryview`, a uint8 NumPy array), read in place: no copy is made of it. More than
    /// the HBM cap is written in windows that fit, one after another.
    #[pyo3(signature = (data, offset=0))]
    fn write(&self, py: Python<'_>, data: PyBuffer<u8>, offset: usize) -> PyResult<()> {
        if !data.is_c_contiguous() {
            return Err(InvalidArgumentError::new_err("write: data must be C-contiguous"));
        }
        let (ptr, len) = (data.buf_ptr() as usize, data.len_bytes());
        py.allow_threads(|| {
            // SAFETY: `data` holds the exporter's buffer (PEP 3118) until after this call, so
            // the `len` bytes at `ptr` stay valid; they are only read.
            let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
            self.engine.write(self.id, offset, bytes)
        })
        .map_err(to_py)
    }

    /// Reads `size` bytes (default: to the end) at `offset` into a `bytes` object.
    #[pyo3(signature = (size=None, offset=0))]
    fn read<'py>(&self, py: Python<'py>, size: Option<usize>, offset: usize) -> PyResult<Bound<'py, PyBytes>> {
        let len = size.unwrap_or(self.size.saturating_sub(offset));
        if offset.checked_add(len).is_none_or(|end| end > self.size) {
            // Refused before the bytes are allocated (a huge size would abort the process).
            let (call, buffer, size) = ("read", self.id, self.size);
            return Err(to_py(tiermem::Error::OutOfRange { call, buffer, offset, len, size }));
        }
        let mut out = vec![0u8; len];
        py.allow_threads(|| self.engine.read(self.id, offset, &mut out)).map_err(to_py)?;
        Ok(PyBytes::new(py, &out))
    }

    /// Frees the buffer now (it must not be acquired). Freeing twice is an error.
    fn free(&self, py: Python<'_>) -> PyResult<()> {
        if self.freed.swap(true, Ordering::AcqRel) {
            return Err(BufferStateError::new_err(format!("free: buffer {} was already freed", self.id)));
        }
        py.allow_threads(|| self.engine.free(self.id)).map_err(|e| {
            self.freed.store(false, Ordering::Release);
            to_py(e)
        })
    }

    /// DLPack export (see `dlpack.rs`): `torch.from_dlpack(buffer)` wraps it with no copy.
    /// Stream arguments are accepted and ignored: ordering is `acquire`'s job.
    #[pyo3(signature = (**_kwargs))]
    fn __dlpack__(slf: Bound<'_, Self>, _kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<PyObject> {
        let py = slf.py();
        crate::dlpack::capsule(py, slf.unbind())
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        crate::dlpack::device(self)
    }

    /// The CUDA Array Interface (version 3): one dimension of `size` bytes, so CuPy, Numba
    /// and `torch.as_tensor` can wrap the buffer without a copy.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("shape", (self.size,))?;
        d.set_item("typestr", "|u1")?;
        d.set_item("data", (self.ptr, false))?;
        d.set_item("version", 3)?;
        d.set_item("strides", py.None())?;
        Ok(d)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if !self.freed.load(Ordering::Acquire) {
            // An acquired buffer cannot be freed; the engine releases it when it is dropped.
            let _ = self.engine.free(self.id);
        }
    }
}
