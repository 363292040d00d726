//! Direct-I/O alignment of an open file, and the arithmetic that keeps transfers within it.

use std::os::fd::RawFd;

/// What `O_DIRECT` demands of a transfer: the memory address and the file offset (and with it
/// the length) must be multiples of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Alignment {
    pub mem: usize,
    pub offset: usize,
}

/// How the alignment was found, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    /// `statx(STATX_DIOALIGN)` (Linux 6.1+, on filesystems that report it).
    Statx,
    /// `st_blksize`, used for both when the kernel or filesystem does not report
    /// `STATX_DIOALIGN`: always sufficient, sometimes stricter than needed.
    Blksize,
}

/// Asks the kernel how `fd` must be aligned for direct I/O. `Ok(None)` means the filesystem
/// says it cannot do direct I/O on this file at all. `Err` carries the call and errno.
pub(super) fn probe(fd: RawFd) -> Result<Option<(Alignment, Source)>, (&'static str, i32)> {
    // SAFETY: an all-zero `statx` is a valid value of this plain C struct.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open; the empty path with AT_EMPTY_PATH names the fd itself; `stx` is a
    // valid, writable `statx` that outlives the call.
    let r = unsafe { libc::statx(fd, c"".as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_DIOALIGN, &mut stx) };
    if r == 0 && stx.stx_mask & libc::STATX_DIOALIGN != 0 {
        let (mem, offset) = (stx.stx_dio_mem_align as usize, stx.stx_dio_offset_align as usize);
        if mem == 0 || offset == 0 {
            return Ok(None);
        }
        return Ok(Some((Alignment { mem, offset }, Source::Statx)));
    }
    // statx failed (ENOSYS on old kernels, EPERM under some seccomp profiles) or the
    // filesystem does not report DIOALIGN: fall back to the block size, which fstat reports
    // with any real error.
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open and `st` is a valid, writable `stat`.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(("fstat", errno()));
    }
    let blk = (st.st_blksize as usize).max(512);
    Ok(Some((Alignment { mem: blk, offset: blk }, Source::Blksize)))
}

pub(super) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// Whether a transfer that has moved `done` bytes of a buffer at `addr` for file offset
/// `offset` can continue with `O_DIRECT` from there.
pub(super) fn can_resume(al: Alignment, addr: usize, offset: u64, done: usize) -> bool {
    (addr + done).is_multiple_of(al.mem) && (offset + done as u64).is_multiple_of(al.offset as u64)
}
