//! Files that `bench swap` makes on the local disk (removed on drop), and the file system they
//! are on: whether it is in memory (where a loop device or swap file could deadlock the
//! kernel), how much of it is free.

use std::ffi::CString;
use std::path::{Path, PathBuf};

/// A file that is removed on drop.
pub struct TempFile(pub PathBuf);

impl TempFile {
    /// A file of `size` bytes with its blocks allocated (no holes: swap files need that).
    pub fn allocated(path: PathBuf, size: u64) -> Result<Self, String> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::remove_file(&path);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| format!("create {}: {e}", path.display()))?;
        let guard = TempFile(path);
        // SAFETY: plain syscall on a descriptor we own.
        if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, size as libc::off_t) } != 0 {
            return Err(format!(
                "fallocate {} bytes for {}: {}",
                size,
                guard.0.display(),
                std::io::Error::last_os_error()
            ));
        }
        Ok(guard)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `path` as a C string, for statfs and statvfs.
fn c_path(path: &Path) -> Result<CString, String> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes()).map_err(|e| e.to_string())
}

/// The file system type of `dir` (statfs's magic number), and whether it lives in memory.
pub fn in_memory_fs(dir: &Path) -> Result<bool, String> {
    let c = c_path(dir)?;
    // SAFETY: statfs fills the struct we pass; the path is a valid C string.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statfs(c.as_ptr(), &mut s) } != 0 {
        return Err(format!("statfs {}: {}", dir.display(), std::io::Error::last_os_error()));
    }
    const TMPFS: i64 = 0x0102_1994;
    const RAMFS: i64 = 0x8584_58f6;
    Ok(matches!(s.f_type as i64, TMPFS | RAMFS))
}

/// Free bytes on the file system of `dir`.
pub fn free_bytes(dir: &Path) -> u64 {
    let Ok(c) = c_path(dir) else { return 0 };
    // SAFETY: statvfs fills the struct we pass; the path is a valid C string.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return 0;
    }
    s.f_bavail as u64 * s.f_frsize as u64
}
