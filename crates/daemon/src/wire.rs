//! Frames on a connection's two halves, with file descriptors beside them where a message
//! carries some (`tiermem_protocol::fd_passing`): tokio's reads and writes drop ancillary data,
//! so both directions go through `recvmsg`/`sendmsg` when the socket is ready.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use tiermem_protocol::fd_passing::{send_with_fds, FdQueue};
use tiermem_protocol::DaemonMessage;
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;

/// A message for a connection's writer, and the descriptors to send with it.
pub(crate) struct Outgoing {
    pub message: DaemonMessage,
    pub fds: Vec<OwnedFd>,
}

/// Reads what has arrived (at least one byte; 0: closed), queueing descriptors that came with it.
pub(crate) async fn read_some(reader: &OwnedReadHalf, buffer: &mut [u8], fds: &mut FdQueue) -> std::io::Result<usize> {
    let stream: &UnixStream = reader.as_ref();
    loop {
        stream.readable().await?;
        match stream.try_io(Interest::READABLE, || fds.recv(stream.as_fd(), buffer)) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            outcome => return outcome,
        }
    }
}

/// Writes `frame`, its first bytes carrying `fds` (none: a plain write).
pub(crate) async fn write_frame(writer: &mut OwnedWriteHalf, frame: &[u8], fds: &[OwnedFd]) -> std::io::Result<()> {
    let mut sent = 0;
    if !fds.is_empty() {
        let stream: &UnixStream = writer.as_ref();
        let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|fd| fd.as_fd()).collect();
        sent = loop {
            stream.writable().await?;
            match stream.try_io(Interest::WRITABLE, || send_with_fds(stream.as_fd(), frame, &borrowed)) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                outcome => break outcome?,
            }
        };
    }
    writer.write_all(&frame[sent..]).await
}
