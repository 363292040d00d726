//! The simulated device's shareable allocations (`Device::create_shareable_chunks_at`): each
//! is a memfd of its own, where the pool chunks of [`super::memory`] share one per location,
//! because a memfd is what a POSIX file descriptor can carry to another process.
//!
//! Exporting an allocation hands out a duplicate of its memfd; importing one takes a duplicate
//! of the descriptor given and keeps it as the importer's handle. Every handle and every
//! mapping refers to the same file, so bytes written through one mapping are seen through every
//! other, in this process or another, and the memory is the kernel's to free once the last
//! descriptor is closed and the last mapping unmapped — as the driver frees an allocation once
//! every process has released and unmapped it.
//!
//! The memfd is sealed against growing and shrinking (and against further seals) when it is
//! made: no holder can truncate it under another's mapping (a `SIGBUS` there), and an import
//! recognises an allocation of ours by those seals, refusing plain files, pipes and other
//! memfds, and checks its size.

use super::{POISON, SIM_GRANULARITY};
use crate::{ChunkLocation, DeviceError, Result};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// The seals every shareable allocation's memfd carries.
const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

const IMPORT: &str = "cuMemImportFromShareableHandle";

/// One shareable allocation, as one handle of this node holds it.
pub(super) struct SharedFile {
    memfd: OwnedFd,
    pub granules: usize,
    /// Where it was made, for an allocation made on this node: counted against that GPU's
    /// capacity while this handle lives. `None` for an import: its memory is some GPU's of the
    /// node, counted by whoever made it, and any GPU may be given access to it.
    pub made_at: Option<ChunkLocation>,
}

impl SharedFile {
    /// A new allocation of `granules` granules at `location`, filled with poison.
    pub fn create(location: ChunkLocation, granules: usize) -> Result<Self> {
        let name = c"tiermem-sim-shareable";
        // SAFETY: memfd_create takes a NUL-terminated name and flags; it returns a new fd or -1.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if fd < 0 {
            return Err(DeviceError::os("memfd_create"));
        }
        // SAFETY: fd was just returned by memfd_create and is owned by nobody else.
        let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
        let size = granules * SIM_GRANULARITY;
        // SAFETY: plain syscall on an fd we own.
        if unsafe { libc::ftruncate(fd, size as libc::off_t) } != 0 {
            return Err(DeviceError::os("ftruncate"));
        }
        let poison = vec![POISON; SIM_GRANULARITY];
        for granule in 0..granules {
            let offset = (granule * SIM_GRANULARITY) as libc::off_t;
            // SAFETY: writes our own buffer into our own memfd, inside its size.
            let n = unsafe { libc::pwrite(fd, poison.as_ptr().cast(), poison.len(), offset) };
            if n != poison.len() as isize {
                return Err(DeviceError::os("pwrite"));
            }
        }
        // SAFETY: plain syscall on an fd we own, made with MFD_ALLOW_SEALING.
        if unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, SEALS) } != 0 {
            return Err(DeviceError::os("fcntl(F_ADD_SEALS)"));
        }
        Ok(Self { memfd, granules, made_at: Some(location) })
    }

    /// A handle of this node to the allocation behind `fd`, which must be `size` bytes long.
    pub fn import(fd: BorrowedFd<'_>, size: usize) -> Result<Self> {
        let raw = fd.as_raw_fd();
        if size == 0 || !size.is_multiple_of(SIM_GRANULARITY) {
            return Err(invalid(format!("fd {raw}: size={size} is not whole granules of {SIM_GRANULARITY} B")));
        }
        // SAFETY: F_GET_SEALS only reads the seals of a descriptor the caller keeps open.
        let seals = unsafe { libc::fcntl(raw, libc::F_GET_SEALS) };
        if seals < 0 || seals & SEALS != SEALS {
            let why = match seals {
                s if s < 0 => format!("fcntl(F_GET_SEALS): {}", std::io::Error::last_os_error()),
                s => format!("its seals are 0x{s:x}"),
            };
            return Err(invalid(format!(
                "fd {raw} is not a simulated shareable allocation (a sealed memfd from export_chunk): {why}"
            )));
        }
        // SAFETY: an all-zero `stat` is a valid value of the plain C struct, filled in by fstat.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid out-pointer; the descriptor is open.
        if unsafe { libc::fstat(raw, &mut stat) } != 0 {
            return Err(DeviceError::os("fstat"));
        }
        if stat.st_size as usize != size {
            return Err(invalid(format!("fd {raw} is an allocation of {} bytes, not {size}", stat.st_size)));
        }
        Ok(Self { memfd: dup(raw)?, granules: size / SIM_GRANULARITY, made_at: None })
    }

    /// A descriptor of the allocation for another process (a duplicate of this handle's).
    pub fn export(&self) -> Result<OwnedFd> {
        dup(self.memfd.as_raw_fd())
    }

    pub fn raw_fd(&self) -> RawFd {
        self.memfd.as_raw_fd()
    }
}

/// A new descriptor of the file `fd` refers to, closed on exec.
fn dup(fd: RawFd) -> Result<OwnedFd> {
    // SAFETY: duplicates a descriptor that is open for the duration of the call.
    let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if new < 0 {
        return Err(DeviceError::os("fcntl(F_DUPFD_CLOEXEC)"));
    }
    // SAFETY: `new` was just made by fcntl and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

fn invalid(detail: String) -> DeviceError {
    DeviceError::Driver { call: IMPORT, code: "CUDA_ERROR_INVALID_VALUE".into(), detail }
}
