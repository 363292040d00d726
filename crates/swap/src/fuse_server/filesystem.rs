//! The filesystem the FUSE server serves: a fixed directory of device files, and the requests
//! on them mapped one to one onto the [`Blocks`] store (see the module above).

use super::io_stats::IoStats;
use super::read_buffers::{Buffers, PAGE};
use super::{DeviceFile, FuseOptions, KernelTerms};
use crate::Blocks;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, Request, WriteFlags,
};
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

const ROOT: u64 = 1;
const TTL: Duration = Duration::from_secs(3600);

/// The filesystem: the fixed tree and the requests on its files.
pub(super) struct SwapFs {
    pub(super) store: Arc<dyn Blocks>,
    pub(super) devices: Vec<DeviceFile>,
    pub(super) buffers: Buffers,
    pub(super) stats: Arc<IoStats>,
    pub(super) options: FuseOptions,
    pub(super) terms: Arc<OnceLock<KernelTerms>>,
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) born: SystemTime,
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
                self.stats.reads_in_store.record(len as u64, started);
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
