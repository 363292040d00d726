//! File descriptors beside frames: the one piece of socket I/O here, since both ends need it
//! and neither runtime (tokio in the daemon, a blocking thread in the tenant) offers it.
//!
//! A message that carries descriptors (memory lent between processes: [`DaemonMessage::Lent`],
//! [`ClientMessage::Slabs`](crate::ClientMessage::Slabs)) says how many in its own fields; its frame
//! is sent with the descriptors attached (`SCM_RIGHTS`) to its first bytes. The kernel hands
//! them to the receiver with the bytes they came with, so by the time a frame has been read
//! whole, its descriptors are in the receiver's queue ([`FdQueue`]), in order: the message
//! takes as many from the front as it says it carries. A peer that announces more than it sent
//! is a protocol error, and descriptors nobody claims are closed with the connection.
//!
//! [`DaemonMessage::Lent`]: crate::DaemonMessage::Lent

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use std::collections::VecDeque;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// The most descriptors one message carries, and the most a connection holds unclaimed.
pub const MAX_FDS: usize = 64;

/// Descriptors received and not yet claimed by a message.
#[derive(Debug, Default)]
pub struct FdQueue {
    fds: VecDeque<OwnedFd>,
}

impl FdQueue {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.fds.len()
    }

    pub fn is_empty(&self) -> bool {
        self.fds.is_empty()
    }

    /// The first `n` descriptors, for a message that says it carries `n` (`what` names it in
    /// the error when fewer came).
    pub fn take(&mut self, n: usize, what: &'static str) -> Result<Vec<OwnedFd>, crate::ProtocolError> {
        if self.fds.len() < n {
            return Err(crate::ProtocolError::Malformed(format!(
                "{what} says it carries {n} file descriptor(s), {} arrived",
                self.fds.len()
            )));
        }
        Ok(self.fds.drain(..n).collect())
    }

    /// Reads from the socket `socket` into `buffer` (one `recvmsg`), queueing any descriptors
    /// that came with the bytes. Returns the bytes read (0: closed). More than [`MAX_FDS`]
    /// unclaimed, or descriptors the kernel had to drop, is an error: the connection is then
    /// unusable.
    pub fn recv(&mut self, socket: BorrowedFd<'_>, buffer: &mut [u8]) -> std::io::Result<usize> {
        let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
        let mut iov = [IoSliceMut::new(buffer)];
        let msg = recvmsg::<()>(socket.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
            .map_err(std::io::Error::from)?;
        let bytes = msg.bytes;
        let truncated = msg.flags.contains(MsgFlags::MSG_CTRUNC);
        if let Ok(cmsgs) = msg.cmsgs() {
            for cmsg in cmsgs {
                if let ControlMessageOwned::ScmRights(fds) = cmsg {
                    // SAFETY: the kernel just installed these descriptors in this process for us;
                    // nothing else owns them.
                    self.fds.extend(fds.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
                }
            }
        }
        if truncated || self.fds.len() > MAX_FDS {
            return Err(std::io::Error::other(format!(
                "the peer sent more file descriptors than the {MAX_FDS} a connection holds unclaimed"
            )));
        }
        Ok(bytes)
    }
}

/// Sends the start of `bytes` on the socket `socket` with `fds` attached (one `sendmsg`);
/// returns how many bytes went (the caller writes the rest as usual). At most [`MAX_FDS`].
pub fn send_with_fds(socket: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> std::io::Result<usize> {
    if fds.len() > MAX_FDS {
        return Err(std::io::Error::other(format!(
            "{} file descriptors in one message (at most {MAX_FDS})",
            fds.len()
        )));
    }
    let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let rights = [ControlMessage::ScmRights(&raw)];
    let cmsgs = if raw.is_empty() { &rights[..0] } else { &rights[..] };
    sendmsg::<()>(socket.as_raw_fd(), &[IoSlice::new(bytes)], cmsgs, MsgFlags::MSG_NOSIGNAL, None)
        .map_err(std::io::Error::from)
}
