//! The protocol between tiermem tenants and the node daemon `tiermemd`: plain messages
//! ([`ClientMessage`], [`DaemonMessage`]), their framing ([`frame`]) and their order
//! ([`session`]), and where to meet ([`paths`]). Pure but for [`fd_passing`] (file descriptors
//! sent beside frames, `SCM_RIGHTS`): no runtime; the daemon (tokio) and the tenant (a blocking
//! thread) bring their own I/O. The wire format is documented in `docs/protocol.md`.
//!
//! Invariants: every byte sequence a peer sends either decodes to a message or is a
//! [`ProtocolError`] (never a panic, never more than [`MAX_FRAME_BYTES`] buffered for one
//! frame); a peer speaking another [`PROTOCOL_VERSION`] is refused at the first message.

pub mod fd_passing;
pub mod frame;
mod messages;
pub mod paths;
pub mod session;

pub use frame::{encode, write_message, FrameDecoder, FrameReader, MAX_FRAME_BYTES};
pub use messages::*;
pub use session::{ServerSession, SessionState};

/// What can go wrong between a tenant and the daemon.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error(
        "a frame of {len} bytes is larger than the protocol's {max}: the peer is not a tiermem peer, or is broken"
    )]
    FrameTooLarge { len: usize, max: usize },
    #[error("a message that does not decode: {0} (is the peer a tiermem of the same version?)")]
    Malformed(String),
    #[error("protocol version {theirs} is not ours ({ours}): run a tiermem and tiermemd of the same release")]
    VersionMismatch { ours: u32, theirs: u32 },
    #[error("message out of order: expected {expected}, got {got}")]
    OutOfOrder { expected: &'static str, got: &'static str },
    #[error("the daemon refused: {message}")]
    Refused { kind: ErrorKind, message: String },
    #[error("the connection closed")]
    Closed,
    #[error("no answer in time")]
    Timeout,
    #[error("socket I/O: {0}")]
    Io(#[from] std::io::Error),
}

impl ProtocolError {
    /// The kind the daemon reports in its [`DaemonMessage::Error`].
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::FrameTooLarge { .. } => ErrorKind::TooLarge,
            Self::Malformed(_) => ErrorKind::Malformed,
            Self::VersionMismatch { .. } => ErrorKind::VersionMismatch,
            Self::OutOfOrder { .. } => ErrorKind::OutOfOrder,
            Self::Refused { kind, .. } => *kind,
            Self::Closed | Self::Timeout | Self::Io(_) => ErrorKind::Internal,
        }
    }

    /// This error as the message the daemon sends before closing.
    pub fn to_message(&self) -> DaemonMessage {
        DaemonMessage::Error { kind: self.kind(), message: self.to_string() }
    }
}

/// Checks the daemon's `welcome` (the first message a client receives).
pub fn check_welcome(message: DaemonMessage) -> Result<String, ProtocolError> {
    match message {
        DaemonMessage::Welcome { version, daemon } if version == PROTOCOL_VERSION => Ok(daemon),
        DaemonMessage::Welcome { version, .. } => {
            Err(ProtocolError::VersionMismatch { ours: PROTOCOL_VERSION, theirs: version })
        }
        DaemonMessage::Error { kind, message } => Err(ProtocolError::Refused { kind, message }),
        other => Err(ProtocolError::OutOfOrder { expected: "welcome", got: other.kind() }),
    }
}
