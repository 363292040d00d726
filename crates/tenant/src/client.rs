//! A blocking connection to the daemon: connect, `hello`/`welcome`, then messages both ways,
//! with file descriptors beside those that carry lent memory (`tiermem_protocol::fd_passing`).
//! Reads time out every [`POLL`] so the caller's loop can do other work between them.

use crate::LinkError;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};
use tiermem_protocol::fd_passing::{send_with_fds, FdQueue};
use tiermem_protocol::{
    check_welcome, write_message, ClientMessage, DaemonMessage, FrameReader, StatusReport, PROTOCOL_VERSION,
};

/// How long one read waits before the caller's loop goes on.
pub const POLL: Duration = Duration::from_millis(20);
/// How long the daemon has to answer `hello`, `register` or `status_request`.
pub const ANSWER: Duration = Duration::from_secs(5);

pub struct Connection {
    stream: UnixStream,
    reader: FrameReader<FdReader>,
}

/// The socket's reading side, keeping the descriptors that arrive with the bytes.
struct FdReader {
    stream: UnixStream,
    fds: FdQueue,
}

impl Read for FdReader {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        self.fds.recv(self.stream.as_fd(), buffer)
    }
}

impl Connection {
    /// Connects to `path` and exchanges `hello`/`welcome` (refusing another protocol version).
    pub fn open(path: &Path, client: &str) -> Result<Self, LinkError> {
        let connect = |source| LinkError::Connect { path: path.to_owned(), source };
        let stream = UnixStream::connect(path).map_err(connect)?;
        stream.set_read_timeout(Some(POLL)).map_err(connect)?;
        // A daemon that stops reading (stopped, hung) must not block the link for ever.
        stream.set_write_timeout(Some(ANSWER)).map_err(connect)?;
        let reader = FrameReader::new(FdReader { stream: stream.try_clone().map_err(connect)?, fds: FdQueue::new() });
        let mut connection = Self { stream, reader };
        connection.send(&ClientMessage::Hello { version: PROTOCOL_VERSION, client: client.to_owned() })?;
        check_welcome(connection.wait()?)?;
        Ok(connection)
    }

    pub fn send(&mut self, message: &ClientMessage) -> Result<(), LinkError> {
        Ok(write_message(&mut self.stream, message)?)
    }

    /// Sends `message` with `fds` beside it (a lender's exported slabs).
    pub fn send_with_fds(&mut self, message: &ClientMessage, fds: &[BorrowedFd<'_>]) -> Result<(), LinkError> {
        use std::io::Write;
        let frame = tiermem_protocol::encode(message)?;
        let sent = send_with_fds(self.stream.as_fd(), &frame, fds).map_err(tiermem_protocol::ProtocolError::Io)?;
        self.stream.write_all(&frame[sent..]).map_err(tiermem_protocol::ProtocolError::Io)?;
        Ok(())
    }

    /// The `n` descriptors that came with the message just read (`what` names it in the error).
    pub fn take_fds(&mut self, n: usize, what: &'static str) -> Result<Vec<OwnedFd>, LinkError> {
        Ok(self.reader.get_mut().fds.take(n, what)?)
    }

    /// The next message, if one arrives within [`POLL`].
    pub fn poll(&mut self) -> Result<Option<DaemonMessage>, LinkError> {
        Ok(self.reader.poll()?)
    }

    /// The next message, within [`ANSWER`].
    pub fn wait(&mut self) -> Result<DaemonMessage, LinkError> {
        Ok(self.reader.wait(Instant::now() + ANSWER)?)
    }
}

/// Asks the daemon at `path` for its status (what this user may see).
pub fn query_status(path: &Path) -> Result<StatusReport, LinkError> {
    let mut connection = Connection::open(path, concat!("tiermem status ", env!("CARGO_PKG_VERSION")))?;
    connection.send(&ClientMessage::StatusRequest)?;
    match connection.wait()? {
        DaemonMessage::Status(report) => Ok(report),
        DaemonMessage::Error { kind, message } => {
            Err(tiermem_protocol::ProtocolError::Refused { kind, message }.into())
        }
        other => Err(LinkError::Unexpected(other.kind())),
    }
}
