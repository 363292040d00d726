//! The FUSE front end: a directory with one regular file per device (`swap0`, `swap1`, …),
//! each a slice of one [`Blocks`] store, opened `direct_io` so the kernel keeps no copy of its
//! pages. A loop device with `--direct-io=on` over such a file is a block device the kernel
//! can swap to (`swapon` refuses the FUSE file itself).
//!
//! Requests map one to one onto the store: `read` → [`Blocks::read`], `write` →
//! [`Blocks::write`], `fallocate(PUNCH_HOLE|KEEP_SIZE)` or `fallocate(ZERO_RANGE)` (what the
//! loop device turns discards and write-zeroes into) → [`Blocks::discard`]; errors are
//! answered with [`crate::SwapError::errno`]. The tree is fixed: nothing can be created,
//! removed, renamed or resized.
//!
//! Several server threads, each with its own cloned `/dev/fuse` descriptor, take requests in
//! parallel; FUSE's asynchronous direct I/O lets one loop device keep several in flight. Read
//! buffers are allocated when the server starts, one per thread and a few spare: a request
//! allocates nothing and logs nothing.
//!
//! ```text
//!  mod.rs           the device files, the options, FuseServer: mount and unmount
//!  filesystem.rs    SwapFs: the fixed tree and the requests on its files
//!  io_stats.rs      request counts, bytes and latency histograms (IoStats, IoReport)
//!  read_buffers.rs  the page-aligned read buffers allocated up front
//! ```

mod filesystem;
mod io_stats;
mod read_buffers;

pub use io_stats::{IoReport, IoStats, OpReport};

use crate::Blocks;
use filesystem::SwapFs;
use fuser::{MountOption, SessionACL};
use read_buffers::Buffers;
use serde::Serialize;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

/// One device file: `size` bytes of the store from `offset`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceFile {
    pub name: String,
    pub offset: u64,
    pub size: u64,
}

/// Splits `size` bytes into `count` equal device files of whole MiB (`swap0`, `swap1`, …), back
/// to back; what does not divide evenly is left unused.
pub fn split_devices(size: u64, count: usize) -> Result<Vec<DeviceFile>, String> {
    const MIB: u64 = 1 << 20;
    if count == 0 {
        return Err("--devices must be at least 1".into());
    }
    let each = size / count as u64 / MIB * MIB;
    if each < 16 * MIB {
        return Err(format!(
            "{} over {count} devices leaves less than 16 MiB each; give a larger --size or fewer --devices",
            tiermem::format_size(size as usize)
        ));
    }
    Ok((0..count).map(|i| DeviceFile { name: format!("swap{i}"), offset: i as u64 * each, size: each }).collect())
}

/// How the server talks to the kernel.
#[derive(Debug, Clone)]
pub struct FuseOptions {
    /// Server threads, each with its own cloned `/dev/fuse` descriptor.
    pub threads: usize,
    /// The largest read or write the kernel sends (`max_write`, and the read buffers' size).
    pub max_io: u32,
    /// Asynchronous requests (the loop device's direct I/O) the kernel keeps in flight.
    pub max_background: u16,
}

impl Default for FuseOptions {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        FuseOptions { threads: cores.clamp(2, 8), max_io: 1 << 20, max_background: 128 }
    }
}

/// What the kernel agreed to at `FUSE_INIT`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct KernelTerms {
    pub abi: String,
    pub async_dio: bool,
    pub max_write: u32,
    pub max_readahead: u32,
    pub max_background: u16,
}

/// A mounted server. [`FuseServer::unmount`] ends it; dropping it detaches the mount lazily.
pub struct FuseServer {
    session: Option<fuser::BackgroundSession>,
    mountpoint: PathBuf,
    files: Vec<PathBuf>,
    stats: Arc<IoStats>,
    terms: Arc<OnceLock<KernelTerms>>,
}

impl FuseServer {
    /// Mounts the files of `devices` (slices of `store`) at `mountpoint`, an existing empty
    /// directory, and starts serving them. Needs root (a direct `mount(2)`; there is no
    /// `fusermount` fallback worth having for a swap device).
    pub fn mount(
        mountpoint: &Path,
        store: Arc<dyn Blocks>,
        devices: &[DeviceFile],
        options: &FuseOptions,
    ) -> io::Result<FuseServer> {
        if let Some(d) = devices.iter().find(|d| d.offset.checked_add(d.size).is_none_or(|end| end > store.size())) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} ({}+{}) is outside the store's {} bytes", d.name, d.offset, d.size, store.size()),
            ));
        }
        let threads = options.threads.max(1);
        let stats = Arc::new(IoStats::new());
        let terms = Arc::new(OnceLock::new());
        // SAFETY: geteuid and getegid cannot fail and touch no memory of ours.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let fs = SwapFs {
            store,
            devices: devices.to_vec(),
            buffers: Buffers::new(threads + 2, options.max_io as usize),
            stats: stats.clone(),
            options: options.clone(),
            terms: terms.clone(),
            uid,
            gid,
            born: SystemTime::now(),
        };
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            MountOption::FSName("tiermem-swap".into()),
            MountOption::Subtype("tiermem".into()),
            MountOption::DefaultPermissions,
            MountOption::NoAtime,
            MountOption::NoExec,
            MountOption::NoSuid,
            MountOption::NoDev,
            MountOption::RW,
        ];
        config.acl = SessionACL::Owner;
        config.n_threads = Some(threads);
        config.clone_fd = true;
        if !is_root() {
            // fuser would fall back to fusermount, which these machines lack; say why instead.
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, "mounting the FUSE server needs root"));
        }
        let session = fuser::Session::new(fs, mountpoint, &config)?.spawn()?;
        Ok(FuseServer {
            session: Some(session),
            mountpoint: mountpoint.to_path_buf(),
            files: devices.iter().map(|d| mountpoint.join(&d.name)).collect(),
            stats,
            terms,
        })
    }

    /// The device files, in the order of the devices given to [`FuseServer::mount`].
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    pub fn stats(&self) -> Arc<IoStats> {
        self.stats.clone()
    }

    /// What the kernel agreed to at `FUSE_INIT`.
    pub fn kernel_terms(&self) -> KernelTerms {
        self.terms.get().cloned().unwrap_or_default()
    }

    /// Unmounts and waits for the server threads. While a file is still open (a loop device
    /// not yet detached) the unmount is retried for `patience`; after that the mount is
    /// detached lazily, its users get `ENOTCONN` once this process exits, and the error says so.
    pub fn unmount(mut self, patience: Duration) -> Result<(), String> {
        let session = self.session.take().expect("mounted");
        let deadline = Instant::now() + patience;
        loop {
            match crate::system::unmount(&self.mountpoint, false) {
                Ok(()) => break,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    let _ = crate::system::unmount(&self.mountpoint, true);
                    // The threads wait on requests that may never come: leave them.
                    std::mem::forget(session);
                    return Err(format!(
                        "{} was still in use after {patience:?}: detached lazily; its users get ENOTCONN \
                         when this server exits",
                        self.mountpoint.display()
                    ));
                }
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => break, // no longer mounted
                Err(e) => return Err(format!("unmounting {}: {e}", self.mountpoint.display())),
            }
        }
        session.join().map_err(|e| format!("the FUSE server ended with an error: {e}"))
    }
}

impl Drop for FuseServer {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            let _ = crate::system::unmount(&self.mountpoint, true);
            std::mem::forget(session);
        }
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_split_in_whole_mib() {
        let d = split_devices((1 << 30) + 12345, 3).unwrap();
        assert_eq!(d.len(), 3);
        assert!(d.iter().all(|d| d.size == 341 << 20));
        assert_eq!(d[2].offset, 682 << 20);
        assert_eq!(d[1].name, "swap1");
        assert!(split_devices(16 << 20, 2).is_err());
        assert!(split_devices(1 << 30, 0).is_err());
    }
}
