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

use crate::Blocks;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, Request, SessionACL, WriteFlags,
};
use serde::Serialize;
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
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

const LINEAR_US: usize = 128;
const BUCKETS: usize = LINEAR_US + 14;

/// Latencies in µs: one bucket per µs up to 128 µs, then one per power of two up to ~2 s.
struct Histogram([AtomicU64; BUCKETS]);

impl Histogram {
    fn new() -> Self {
        Histogram(std::array::from_fn(|_| AtomicU64::new(0)))
    }

    fn bucket(us: u64) -> usize {
        if us < LINEAR_US as u64 {
            us as usize
        } else {
            (LINEAR_US + (63 - us.leading_zeros() as usize) - 7).min(BUCKETS - 1)
        }
    }

    /// The upper bound, in µs, of bucket `i`.
    fn upper(i: usize) -> u64 {
        if i < LINEAR_US {
            i as u64 + 1
        } else {
            1 << (i - LINEAR_US + 8)
        }
    }

    fn record(&self, us: u64) {
        self.0[Self::bucket(us)].fetch_add(1, Ordering::Relaxed);
    }

    /// The latency below which `fraction` of the requests finished (the bucket's upper bound).
    fn quantile(&self, fraction: f64) -> Option<u64> {
        let counts: Vec<u64> = self.0.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let wanted = ((total as f64 * fraction).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, count) in counts.iter().enumerate() {
            seen += count;
            if seen >= wanted {
                return Some(Self::upper(i));
            }
        }
        Some(Self::upper(BUCKETS - 1))
    }
}

/// Counts of one kind of request.
struct OpStats {
    count: AtomicU64,
    bytes: AtomicU64,
    nanos: AtomicU64,
    latency: Histogram,
}

impl OpStats {
    fn new() -> Self {
        OpStats {
            count: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            nanos: AtomicU64::new(0),
            latency: Histogram::new(),
        }
    }

    fn record(&self, bytes: u64, started: Instant) {
        let nanos = started.elapsed().as_nanos() as u64;
        self.count.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.nanos.fetch_add(nanos, Ordering::Relaxed);
        self.latency.record(nanos / 1000);
    }

    fn report(&self) -> OpReport {
        let count = self.count.load(Ordering::Relaxed);
        let nanos = self.nanos.load(Ordering::Relaxed);
        OpReport {
            count,
            bytes: self.bytes.load(Ordering::Relaxed),
            mean_us: if count == 0 { None } else { Some(nanos as f64 / count as f64 / 1000.0) },
            p50_us: self.latency.quantile(0.5),
            p99_us: self.latency.quantile(0.99),
            p999_us: self.latency.quantile(0.999),
        }
    }
}

/// One kind of request as [`IoStats::report`] gives it: latencies are the server's, from the
/// request's arrival to its reply; percentiles are upper bounds of 1 µs buckets (below 128 µs).
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct OpReport {
    pub count: u64,
    pub bytes: u64,
    pub mean_us: Option<f64>,
    pub p50_us: Option<u64>,
    pub p99_us: Option<u64>,
    pub p999_us: Option<u64>,
}

/// The requests the server answered.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct IoReport {
    pub reads: OpReport,
    pub writes: OpReport,
    pub discards: OpReport,
    /// Requests answered with an error (the store's, or a request outside a file).
    pub errors: u64,
    /// Reads larger than the preallocated buffers, or arriving when all were taken: each
    /// allocated a buffer (none expected).
    pub buffer_allocations: u64,
}

/// The server's counters, shared with whoever reports them.
pub struct IoStats {
    reads: OpStats,
    writes: OpStats,
    discards: OpStats,
    errors: AtomicU64,
    buffer_allocations: AtomicU64,
}

impl IoStats {
    fn new() -> Self {
        IoStats {
            reads: OpStats::new(),
            writes: OpStats::new(),
            discards: OpStats::new(),
            errors: AtomicU64::new(0),
            buffer_allocations: AtomicU64::new(0),
        }
    }

    pub fn report(&self) -> IoReport {
        IoReport {
            reads: self.reads.report(),
            writes: self.writes.report(),
            discards: self.discards.report(),
            errors: self.errors.load(Ordering::Relaxed),
            buffer_allocations: self.buffer_allocations.load(Ordering::Relaxed),
        }
    }
}

/// Page-aligned read buffers, allocated up front. A buffer is a `Vec` one page longer than
/// needed, used from its first page boundary.
struct Buffers {
    free: Mutex<Vec<Vec<u8>>>,
    len: usize,
}

const PAGE: usize = 4096;

impl Buffers {
    fn new(count: usize, len: usize) -> Self {
        Buffers { free: Mutex::new((0..count).map(|_| vec![0u8; len + PAGE]).collect()), len }
    }

    /// A buffer of at least `len` bytes; `None` from the pool means it was allocated.
    fn take(&self, len: usize) -> (Vec<u8>, bool) {
        if len <= self.len {
            if let Some(buffer) = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop() {
                return (buffer, true);
            }
        }
        (vec![0u8; len.max(self.len) + PAGE], false)
    }

    fn give(&self, buffer: Vec<u8>) {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).push(buffer);
    }

    fn aligned(buffer: &mut [u8], len: usize) -> &mut [u8] {
        let skip = buffer.as_ptr().align_offset(PAGE).min(PAGE);
        &mut buffer[skip..skip + len]
    }
}

const ROOT: u64 = 1;
const TTL: Duration = Duration::from_secs(3600);

/// The filesystem: the fixed tree and the requests on its files.
struct SwapFs {
    store: Arc<dyn Blocks>,
    devices: Vec<DeviceFile>,
    buffers: Buffers,
    stats: Arc<IoStats>,
    options: FuseOptions,
    terms: Arc<OnceLock<KernelTerms>>,
    uid: u32,
    gid: u32,
    born: SystemTime,
}

impl SwapFs {
    fn device(&self, ino: INodeNo) -> Option<&DeviceFile> {
        ino.0.checked_sub(2).and_then(|i| self.devices.get(i as usize))
    }

    fn attr(&self, ino: INodeNo) -> Option<FileAttr> {
        let (kind, size, perm, nlink) = if ino.0 == ROOT {
            (FileType::Directory, 0, 0o700, 2)
        } else {
            (FileType::RegularFile, self.device(ino)?.size, 0o600, 1)
        };
        Some(FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: self.born,
            mtime: self.born,
            ctime: self.born,
            crtime: self.born,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: PAGE as u32,
            flags: 0,
        })
    }

    fn fail(&self, errno: i32) -> Errno {
        self.stats.errors.fetch_add(1, Ordering::Relaxed);
        Errno::from_i32(errno)
    }
}

impl Filesystem for SwapFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let max_write = match config.set_max_write(self.options.max_io) {
            Ok(_) => self.options.max_io,
            Err(nearest) => config.set_max_write(nearest).map(|_| nearest).unwrap_or(0),
        };
        let max_readahead = match config.set_max_readahead(self.options.max_io) {
            Ok(_) => self.options.max_io,
            Err(nearest) => config.set_max_readahead(nearest).map(|_| nearest).unwrap_or(0),
        };
        let async_dio = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO).is_ok();
        let background = self.options.max_background.max(1);
        let _ = config.set_max_background(background);
        let _ = config.set_congestion_threshold((background as u32 * 3 / 4).max(1) as u16);
        let abi = config.kernel_abi();
        let _ = self.terms.set(KernelTerms {
            abi: format!("{}.{}", abi.0, abi.1),
            async_dio,
            max_write,
            max_readahead,
            max_background: background,
        });
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let found = (parent.0 == ROOT)
            .then(|| self.devices.iter().position(|d| d.name.as_bytes() == name.as_bytes()))
            .flatten();
        match found.and_then(|i| self.attr(INodeNo(i as u64 + 2))) {
            Some(attr) => reply.entry(&TTL, &attr, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(ino) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // The tree is fixed: a device's size never changes; other changes are ignored.
        match self.attr(ino) {
            Some(attr) if size.is_none_or(|s| s == attr.size) => reply.attr(&TTL, &attr),
            Some(_) => reply.error(Errno::EPERM),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.device(ino).is_some() {
            // direct_io: no page cache for these files, so a page swapped out leaves RAM.
            reply.opened(FileHandle(ino.0), FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES)
        } else if ino.0 == ROOT {
            reply.error(Errno::EISDIR)
        } else {
            reply.error(Errno::ENOENT)
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let started = Instant::now();
        let Some(device) = self.device(ino) else { return reply.error(self.fail(libc::ENOENT)) };
        if offset >= device.size {
            return reply.data(&[]);
        }
        let len = (size as u64).min(device.size - offset) as usize;
        let (mut buffer, pooled) = self.buffers.take(len);
        if !pooled {
            self.stats.buffer_allocations.fetch_add(1, Ordering::Relaxed);
        }
        let out = Buffers::aligned(&mut buffer, len);
        match self.store.read(device.offset + offset, out) {
            Ok(()) => {
                reply.data(out);
                self.stats.reads.record(len as u64, started);
            }
            Err(e) => reply.error(self.fail(e.errno())),
        }
        if pooled {
            self.buffers.give(buffer);
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let started = Instant::now();
        let Some(device) = self.device(ino) else { return reply.error(self.fail(libc::ENOENT)) };
        if offset >= device.size {
            return reply.error(self.fail(libc::ENOSPC));
        }
        // A write across the end stores what fits, as a full disk would.
        let len = (data.len() as u64).min(device.size - offset) as usize;
        match self.store.write(device.offset + offset, &data[..len]) {
            Ok(()) => {
                reply.written(len as u32);
                self.stats.writes.record(len as u64, started);
            }
            Err(e) => reply.error(self.fail(e.errno())),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let started = Instant::now();
        let Some(device) = self.device(ino) else { return reply.error(self.fail(libc::ENOENT)) };
        let Some(end) = offset.checked_add(length) else { return reply.error(self.fail(libc::EINVAL)) };
        const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
        const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        const ZERO: i32 = libc::FALLOC_FL_ZERO_RANGE;
        const ZERO_KEEP: i32 = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
        match mode {
            // Discards and write-zeroes: the range reads as zeros and its memory is given back.
            PUNCH | ZERO | ZERO_KEEP => {
                if mode & KEEP == 0 && end > device.size {
                    return reply.error(self.fail(libc::EFBIG));
                }
                let end = end.min(device.size);
                if offset < end {
                    if let Err(e) = self.store.discard(device.offset + offset, end - offset) {
                        return reply.error(self.fail(e.errno()));
                    }
                    self.stats.discards.record(end - offset, started);
                }
                reply.ok()
            }
            // Preallocation: every byte of a device is always there.
            0 | KEEP => {
                if mode == 0 && end > device.size {
                    reply.error(self.fail(libc::EFBIG))
                } else {
                    reply.ok()
                }
            }
            _ => reply.error(self.fail(libc::EOPNOTSUPP)),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.ok()
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        // Writes are in the store when they are answered.
        reply.ok()
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        if ino.0 != ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let dots = [(ROOT, "."), (ROOT, "..")].into_iter().map(|(i, n)| (i, FileType::Directory, n));
        let files =
            self.devices.iter().enumerate().map(|(i, d)| (i as u64 + 2, FileType::RegularFile, d.name.as_str()));
        for (next, (ino, kind, name)) in dots.chain(files).enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), next as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok()
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // The loop device's discard granularity is this block size.
        let blocks = self.devices.iter().map(|d| d.size).sum::<u64>() / PAGE as u64;
        reply.statfs(blocks, 0, 0, self.devices.len() as u64, 0, PAGE as u32, 255, PAGE as u32)
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok()
    }
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
    fn histogram_buckets_and_quantiles() {
        assert_eq!(Histogram::bucket(0), 0);
        assert_eq!(Histogram::bucket(127), 127);
        assert_eq!(Histogram::bucket(128), 128);
        assert_eq!(Histogram::upper(128), 256);
        assert_eq!(Histogram::bucket(255), 128);
        assert_eq!(Histogram::bucket(256), 129);
        assert_eq!(Histogram::bucket(u64::MAX), BUCKETS - 1);
        let h = Histogram::new();
        assert_eq!(h.quantile(0.5), None);
        for us in [10, 10, 10, 40, 1000] {
            h.record(us);
        }
        assert_eq!(h.quantile(0.5), Some(11));
        assert_eq!(h.quantile(0.8), Some(41));
        assert_eq!(h.quantile(0.99), Some(1024));
    }

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

    #[test]
    fn buffers_are_page_aligned() {
        let pool = Buffers::new(1, 3 * PAGE);
        let (mut b, pooled) = pool.take(3 * PAGE);
        assert!(pooled);
        assert_eq!(Buffers::aligned(&mut b, 3 * PAGE).as_ptr() as usize % PAGE, 0);
        let (_, pooled) = pool.take(PAGE);
        assert!(!pooled, "the pool had one buffer");
        pool.give(b);
        assert!(!pool.take(4 * PAGE).1, "larger than the pool's buffers");
    }
}
