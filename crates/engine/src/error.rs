use crate::BufferId;
use tiermem_mechanism::DeviceError;

/// Errors of the engine. Each names the call that failed and the sizes involved; an
/// operation that returns an error has changed nothing the caller can observe (no byte lost,
/// no pin taken), though chunks may have moved between tiers. The one exception says so:
/// [`Error::PartlyWritten`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("{call}: size must be greater than zero")]
    ZeroSize { call: &'static str },
    #[error("{call}: buffer {buffer} does not exist (never allocated, or already freed)")]
    UnknownBuffer { call: &'static str, buffer: BufferId },
    #[error("{call}: range {offset}+{len} is outside buffer {buffer} of {size} bytes")]
    OutOfRange { call: &'static str, buffer: BufferId, offset: usize, len: usize, size: usize },
    #[error("{call}: buffer {buffer} is acquired ({pinned_chunks} chunks pinned); release it first")]
    Acquired { call: &'static str, buffer: BufferId, pinned_chunks: usize },
    #[error("release: buffer {buffer} bytes {offset}+{len} were not acquired")]
    NotAcquired { buffer: BufferId, offset: usize, len: usize },
    #[error("{call}: buffer {buffer} is read-only; acquire it ReadOnly (Engine::write loads its contents)")]
    ReadOnly { call: &'static str, buffer: BufferId },
    #[error("{call}: buffer {buffer} has chunks acquired in place (read in a neighbour GPU's HBM) for reading; release them before acquiring them for writing")]
    AcquiredInPlace { call: &'static str, buffer: BufferId },
    #[error("{call}: {requested} bytes can never be resident at once: the HBM cap is {cap} bytes")]
    WouldNeverFit { call: &'static str, requested: usize, cap: usize },
    #[error("{call}: out of memory: {detail}")]
    OutOfMemory { call: &'static str, detail: String },
    #[error("{call}: buffer {buffer} is both outgoing and incoming")]
    Conflict { call: &'static str, buffer: BufferId },
    #[error("{call}: unknown ticket {ticket} (already finished?)")]
    UnknownTicket { call: &'static str, ticket: u64 },
    #[error("{call}: {source}")]
    Device { call: &'static str, source: DeviceError },
    /// The file tier failed (no space, an I/O error, a checksum mismatch); the chunks
    /// involved stayed where they were.
    #[error("{call}: file tier: {source}")]
    File { call: &'static str, source: tiermem_mechanism::file_store::FileStoreError },
    /// `write` of more than the HBM cap goes in windows that fit, one after another: one
    /// failed (`source`) after the first `written` bytes were written. The rest are as before.
    #[error("{call}: only the first {written} bytes were written: {source}")]
    PartlyWritten { call: &'static str, written: usize, source: Box<Error> },
    #[error("{call}: {detail}")]
    Schedule { call: &'static str, detail: String },
    #[error("configuration: {0}")]
    Config(String),
    /// Internal: the call must wait for transfers with the engine's lock released, then try
    /// again (engine.rs, "Locking"). Never returned by a public call.
    #[doc(hidden)]
    #[error("{}: must wait for transfers in flight (internal; please report this as a bug)", .0.call)]
    MustWait(crate::fence::Waits),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Re-attributes an engine error raised inside a helper to the public call.
pub(crate) fn retag(error: Error, call: &'static str) -> Error {
    match error {
        Error::Device { source, .. } => Error::Device { call, source },
        Error::OutOfMemory { detail, .. } => Error::OutOfMemory { call, detail },
        Error::File { source, .. } => Error::File { call, source },
        other => other,
    }
}

impl Error {
    /// The CUDA driver is shutting down under this call: the process is exiting.
    pub fn is_driver_shutdown(&self) -> bool {
        match self {
            Error::Device { source, .. } => matches!(source, DeviceError::DriverShutDown { .. }),
            Error::PartlyWritten { source, .. } => source.is_driver_shutdown(),
            _ => false,
        }
    }
}

/// Attaches the engine call to a device error: `acquire: cuMemMap failed: …`.
pub(crate) trait Context<T> {
    fn during(self, call: &'static str) -> Result<T>;
}

impl<T> Context<T> for std::result::Result<T, DeviceError> {
    fn during(self, call: &'static str) -> Result<T> {
        self.map_err(|source| Error::Device { call, source })
    }
}
