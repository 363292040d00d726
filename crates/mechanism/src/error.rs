/// Errors of the mechanism layer. Every driver error names the call that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// A driver call returned an error code.
    #[error("{call} failed: {code} ({detail})")]
    Driver { call: &'static str, code: String, detail: String },
    /// The driver is shutting down (`CUDA_ERROR_DEINITIALIZED`): the process is exiting and no
    /// driver call can succeed any more. Background threads stop quietly on it.
    #[error("{call} failed: the CUDA driver is shutting down (the process is exiting)")]
    DriverShutDown { call: &'static str },
    /// The driver reported that device memory is exhausted.
    #[error("{call} failed: out of device memory ({detail})")]
    OutOfMemory { call: &'static str, detail: String },
    /// No CUDA driver library could be loaded on this machine.
    #[error("no CUDA driver: {0}")]
    NoDriver(String),
    /// A driver is present but the requested GPU is not.
    #[error("no such GPU: {0}")]
    NoDevice(String),
    /// The device lacks a capability tiermem needs (e.g. the VMM API).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// An operating-system call failed (simulated device, pinned memory).
    #[error("{call} failed: {detail}")]
    Os { call: &'static str, detail: String },
    /// The simulated device caught an access to memory that is not mapped with access,
    /// where a GPU would raise an illegal-address fault.
    #[error("illegal address: {0}")]
    Fault(String),
    /// A configuration value could not be understood.
    #[error("configuration: {0}")]
    Config(String),
}

impl DeviceError {
    pub(crate) fn os(call: &'static str) -> Self {
        DeviceError::Os { call, detail: std::io::Error::last_os_error().to_string() }
    }
}

pub type Result<T, E = DeviceError> = std::result::Result<T, E>;
