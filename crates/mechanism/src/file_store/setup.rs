//! Opening the file: direct-I/O alignment, preallocation, `O_DIRECT`, and the I/O path.

use std::os::fd::RawFd;
use std::path::Path;

use super::align::{self, Alignment};
use super::{threads, uring, Backend, FileStoreError, IoChoice};

/// At most this many threads on the thread-pool path, whatever the queue depth.
const MAX_THREADS: u32 = 8;

pub(super) fn probe_alignment(fd: RawFd, path: &Path) -> Result<Alignment, FileStoreError> {
    match align::probe(fd) {
        Ok(Some((al, _))) => Ok(al),
        Ok(None) => Err(FileStoreError::Config(format!(
            "the filesystem of {} does not support direct I/O (statx reports no DIO alignment)",
            path.display()
        ))),
        Err((call, errno)) => Err(FileStoreError::os(call, path, errno)),
    }
}

pub(super) fn preallocate(fd: RawFd, path: &Path, capacity: usize) -> Result<(), FileStoreError> {
    // SAFETY: plain syscall on an open descriptor; it touches no memory of ours.
    if unsafe { libc::fallocate(fd, 0, 0, capacity as libc::off_t) } == 0 {
        return Ok(());
    }
    let errno = align::errno();
    if errno != libc::EOPNOTSUPP {
        return Err(FileStoreError::os("fallocate", path, errno));
    }
    // The descriptor is not O_DIRECT yet, so glibc's emulation (writing a byte per block)
    // works here.
    // SAFETY: as above.
    let r = unsafe { libc::posix_fallocate(fd, 0, capacity as libc::off_t) };
    if r != 0 {
        return Err(FileStoreError::os("posix_fallocate", path, r));
    }
    Ok(())
}

pub(super) fn enable_direct(fd: RawFd, path: &Path) -> Result<(), FileStoreError> {
    // SAFETY: fcntl on an open descriptor, no pointers.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(FileStoreError::os("fcntl(F_GETFL)", path, align::errno()));
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_DIRECT) } != 0 {
        let errno = align::errno();
        if errno == libc::EINVAL {
            return Err(FileStoreError::Config(format!(
                "the filesystem of {} does not support O_DIRECT (fcntl(F_SETFL, O_DIRECT): {})",
                path.display(),
                std::io::Error::from_raw_os_error(errno)
            )));
        }
        return Err(FileStoreError::os("fcntl(F_SETFL, O_DIRECT)", path, errno));
    }
    Ok(())
}

pub(super) fn make_backend(
    fd: RawFd,
    al: Alignment,
    depth: u32,
    io: IoChoice,
    path: &Path,
) -> Result<Backend, FileStoreError> {
    let threads = || {
        threads::Pool::new(fd, al, depth.min(MAX_THREADS) as usize).map(Backend::Threads).map_err(|e| {
            FileStoreError::Os { call: "std::thread::spawn", path: path.display().to_string(), detail: e.to_string() }
        })
    };
    if io == IoChoice::Threads {
        return threads();
    }
    match uring::UringPool::new(fd, al, depth) {
        Ok(pool) => Ok(Backend::Uring(pool)),
        Err(e) => {
            let errno = e.raw_os_error().unwrap_or(libc::EIO);
            let refused = matches!(errno, libc::EPERM | libc::EACCES | libc::ENOSYS);
            if io == IoChoice::Auto && refused {
                threads()
            } else {
                Err(FileStoreError::os("io_uring_setup", path, errno))
            }
        }
    }
}
