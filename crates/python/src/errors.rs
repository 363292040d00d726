//! tiermem's errors as Python exceptions; each carries the engine's message, which names the
//! failing call.

use pyo3::prelude::*;
use pyo3::{create_exception, PyErr};
use tiermem::Error;
use tiermem_capi::TiermemStatus;

create_exception!(tiermem, TiermemError, pyo3::exceptions::PyException, "Base class of every tiermem error.");
create_exception!(tiermem, OutOfMemoryError, TiermemError, "Every tier that could take the data is full.");
create_exception!(tiermem, WouldNeverFitError, TiermemError, "More was asked to be resident at once than the HBM cap.");
create_exception!(
    tiermem,
    InvalidArgumentError,
    TiermemError,
    "A size, range, ticket or setting that cannot be right."
);
create_exception!(
    tiermem,
    BufferStateError,
    TiermemError,
    "The buffer does not exist, is acquired, is not acquired, or is read-only."
);
create_exception!(tiermem, DeviceError, TiermemError, "The GPU driver (or the simulated device) failed.");
create_exception!(
    tiermem,
    FileTierError,
    TiermemError,
    "The file tier failed: no space, an I/O error, a corrupted slot."
);

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("TiermemError", py.get_type::<TiermemError>())?;
    m.add("OutOfMemoryError", py.get_type::<OutOfMemoryError>())?;
    m.add("WouldNeverFitError", py.get_type::<WouldNeverFitError>())?;
    m.add("InvalidArgumentError", py.get_type::<InvalidArgumentError>())?;
    m.add("BufferStateError", py.get_type::<BufferStateError>())?;
    m.add("DeviceError", py.get_type::<DeviceError>())?;
    m.add("FileTierError", py.get_type::<FileTierError>())?;
    Ok(())
}

/// The Python exception for an engine error: the class is the C ABI's status for it, so every
/// front end sorts errors the same way.
pub fn to_py(error: Error) -> PyErr {
    let message = error.to_string();
    match tiermem_capi::status_of(&error) {
        TiermemStatus::OutOfMemory => OutOfMemoryError::new_err(message),
        TiermemStatus::WouldNeverFit => WouldNeverFitError::new_err(message),
        TiermemStatus::InvalidArgument | TiermemStatus::NotInitialized => InvalidArgumentError::new_err(message),
        TiermemStatus::BufferState => BufferStateError::new_err(message),
        TiermemStatus::Device => DeviceError::new_err(message),
        TiermemStatus::FileTier => FileTierError::new_err(message),
        TiermemStatus::Ok | TiermemStatus::Internal => TiermemError::new_err(message),
    }
}
