//! What the two I/O paths share: one transfer per slot, and what became of it.

use super::align::{can_resume, Alignment};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dir {
    Read,
    Write,
}

/// One slot's transfer: `len` bytes between the caller's `buf` and the file at `offset`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Op {
    pub slot: u32,
    pub offset: u64,
    pub buf: *mut u8,
    pub len: usize,
}

/// What became of one [`Op`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// All bytes moved; the crc32c of the buffer afterwards (the data written, or read).
    Done(u32),
    /// `call` failed with `errno` after `done` bytes had moved.
    Errno { call: &'static str, errno: i32, done: usize, injected: bool },
    /// The transfer stopped after `done` bytes: end of file (read), a write that took
    /// nothing, or a partial transfer that `O_DIRECT` cannot resume at that alignment.
    Short { done: usize },
    /// Not started, because another op of the same call failed first.
    NotAttempted,
}

impl Outcome {
    pub fn failed(&self) -> bool {
        !matches!(self, Outcome::Done(_) | Outcome::NotAttempted)
    }
}

/// After a transfer call moved `n` more bytes (`done` counts them already): what next.
pub(super) enum Next {
    Complete,
    Resubmit,
    Short,
}

pub(super) fn next(op: &Op, al: Alignment, n: usize, done: usize) -> Next {
    if done >= op.len {
        Next::Complete
    } else if n == 0 || !can_resume(al, op.buf as usize, op.offset, done) {
        Next::Short
    } else {
        Next::Resubmit
    }
}

/// The crc32c of an op's buffer.
///
/// # Safety
/// `op.buf` must be valid for reading `op.len` bytes, and nothing may write them meanwhile.
pub(super) unsafe fn crc_of(op: &Op) -> u32 {
    // SAFETY: guaranteed by the caller.
    crc32c::crc32c(unsafe { std::slice::from_raw_parts(op.buf, op.len) })
}

/// Transient errors after which a transfer is simply tried again (a bounded number of times).
pub(super) fn transient(errno: i32) -> bool {
    errno == libc::EINTR || errno == libc::EAGAIN
}

/// How often a transient error is retried before it counts as a failure.
pub(super) const RETRIES: u32 = 16;
