//! The file tier: fixed-size slots in one preallocated file, read and written with `O_DIRECT`.
//!
//! A [`FileStore`] is the bottom of the hierarchy (DESIGN.md, tier 3). The engine pages a
//! chunk out by copying it to pinned host memory and handing that memory to
//! [`FileStore::write`]; it pages a chunk in with [`FileStore::read`] into pinned host memory
//! and copies from there to the GPU. One slot holds one chunk (2 MiB in production). Like
//! Bakita & Anderson's NVMe paging, the store moves whole slots with direct I/O — no page
//! cache, so pages the engine dropped are not kept twice in DRAM — and keeps many requests
//! in flight so the SSD works on them concurrently. A slot stays valid after it is read, so a
//! read-only buffer (their model weights, "written once") is written once and read any number
//! of times.
//!
//! **The file.** `open` creates or truncates `path`, preallocates `capacity` bytes with
//! `fallocate` (`posix_fallocate` where the filesystem lacks it), so that running out of
//! disk is found at open rather than in the middle of an eviction, and then switches the
//! descriptor to `O_DIRECT`. The file is the store's own: nothing in it means anything
//! without the store's in-memory checksums, so it is removed when the store is dropped.
//! [`FileStore::free`] punches the slots' holes (`FALLOC_FL_PUNCH_HOLE | KEEP_SIZE`) to give
//! the disk space back; writing such a slot again allocates anew and can therefore hit
//! `ENOSPC`, which is reported as [`FileStoreError::NoSpace`] — the caller's bytes were only
//! read, so nothing is lost.
//!
//! **Alignment.** `O_DIRECT` needs buffer addresses, file offsets and lengths aligned.
//! `statx(STATX_DIOALIGN)` says how (often 4 or 512 bytes for memory, 512 or 4096 for
//! offsets), with `st_blksize` for both as the fallback. Slot size and capacity must be
//! multiples of the offset alignment; caller buffers must be aligned to
//! [`FileStore::alignment`]`.0` — page-aligned memory always is.
//!
//! **I/O paths.** io_uring when the kernel allows it ([`IoPath::Uring`], see `uring.rs`), else
//! — `io_uring_setup` answering `EPERM`, `EACCES` or `ENOSYS`, as in many containers, or on
//! request — a small pool of threads doing `pread`/`pwrite` ([`IoPath::Threads`], see
//! `threads.rs`). io_uring keeps up to `queue_depth` slots in flight per call, the thread
//! pool `min(queue_depth, 8)` in all; both resume short transfers at the remainder, retry `EINTR`/`EAGAIN` a bounded number of times, and never
//! return while the kernel may still touch caller memory — on error paths too. After the first
//! failure in a call no new slot is started; those already in flight are waited for.
//!
//! **Durability and integrity.** A write returns when every slot's `O_DIRECT` write has
//! completed: the data has left the caller's buffer and every later read returns it. There is
//! no `fdatasync`: the store does not survive its process (the checksums and the slot map are
//! in memory, the file is truncated at open and removed on drop), so surviving a power cut
//! would buy nothing and would cost a journal commit per call. Each slot's crc32c is recorded
//! at write and checked at read, so a file changed, truncated or corrupted underneath is an
//! error naming the slot, never wrong data handed back as right.
//!
//! **Threads.** `FileStore` is `Send + Sync`: the slot map is behind a mutex held only
//! briefly, and each I/O call drives its own io_uring ring (or shares the thread pool), so
//! calls from several threads run concurrently. Calls that name the same slot at the same
//! time, or free a slot with I/O on it in flight, are the caller's bug (the outcome is
//! unspecified but memory-safe).
//!
//! **Faults for tests.** With the `failpoints` feature, the failpoints `file_store::write`
//! and `file_store::read` are evaluated once per slot, in order, before any I/O of a call;
//! where one fires, that slot fails with `EIO` (or the errno given as `return(28)`), the slots
//! before it are transferred and those after it are not started, as for a real error.

mod align;
mod error;
mod io;
mod setup;
mod slots;
mod threads;
mod uring;

pub use error::FileStoreError;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::faults::RandomFaults;
use align::Alignment;
use io::{Dir, Op, Outcome};
use slots::{SlotState, Slots};

/// The largest slot the store accepts (one `pread` moves at most ~2 GiB).
const MAX_SLOT_SIZE: usize = 1 << 30;

/// Which I/O path [`FileStore::open`] should set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoChoice {
    /// io_uring, or the thread pool where io_uring is refused (`EPERM`, `EACCES`, `ENOSYS`).
    #[default]
    Auto,
    /// io_uring or an error.
    Uring,
    /// The thread pool.
    Threads,
}

impl std::str::FromStr for IoChoice {
    type Err = FileStoreError;
    fn from_str(s: &str) -> Result<Self, FileStoreError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(Self::Auto),
            "uring" | "io_uring" | "io-uring" => Ok(Self::Uring),
            "threads" | "thread" => Ok(Self::Threads),
            other => Err(FileStoreError::Config(format!("I/O path {other:?}: expected auto, uring or threads"))),
        }
    }
}

/// The I/O path a store is using.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoPath {
    Uring,
    Threads,
}

impl std::fmt::Display for IoPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IoPath::Uring => "io_uring (O_DIRECT, unregistered buffers)",
            IoPath::Threads => "thread pool pread/pwrite (O_DIRECT)",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileStoreConfig {
    /// The file; created or truncated at open, removed when the store is dropped.
    pub path: PathBuf,
    /// Bytes: a multiple of `slot_size`.
    pub capacity: usize,
    /// Bytes per slot: a multiple of the file's direct-I/O offset alignment (2 MiB in
    /// production: one chunk).
    pub slot_size: usize,
    /// Slots in flight at once per call: the io_uring ring size, or the thread count (capped
    /// at 8) on the thread-pool path. io_uring wants 32 or more to reach the disk's speed.
    pub queue_depth: u32,
    pub io: IoChoice,
}

/// One slot of a [`FileStore`], as `alloc` hands it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileSlot(pub u32);

enum Backend {
    Uring(uring::UringPool),
    Threads(threads::Pool),
}

/// A file-backed tier of fixed-size slots. See the module documentation.
///
/// `FileStore` is `Send + Sync`; the slot map is serialised internally, I/O runs per call.
pub struct FileStore {
    // Declared before `file`, so it is dropped first: worker threads are joined and rings
    // closed while the descriptor they use is still open.
    backend: Backend,
    file: File,
    path: PathBuf,
    slot_size: usize,
    al: Alignment,
    slots: Mutex<Slots>,
    /// Cleared when the filesystem answers `EOPNOTSUPP` to punching holes.
    punch: AtomicBool,
    /// Reads and writes that fail at random with `EIO`, for tests (`inject_errors`).
    faults: Mutex<RandomFaults>,
}

impl std::fmt::Debug for FileStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileStore")
            .field("path", &self.path)
            .field("io_path", &self.io_path())
            .field("slot_size", &self.slot_size)
            .field("capacity_slots", &self.capacity_slots())
            .field("used_slots", &self.used_slots())
            .field("alignment", &self.al)
            .finish()
    }
}

impl FileStore {
    /// Creates (or truncates) and preallocates the file and sets up the I/O path.
    pub fn open(config: FileStoreConfig) -> Result<Self, FileStoreError> {
        let FileStoreConfig { path, capacity, slot_size, queue_depth, io } = config;
        if slot_size == 0 || slot_size > MAX_SLOT_SIZE {
            return config_err(format!("slot_size {slot_size} must be between 1 and {MAX_SLOT_SIZE} bytes"));
        }
        if capacity == 0 || capacity % slot_size != 0 {
            return config_err(format!("capacity {capacity} must be a positive multiple of slot_size {slot_size}"));
        }
        let nslots = capacity / slot_size;
        if nslots > u32::MAX as usize {
            return config_err(format!(
                "capacity {capacity} holds {nslots} slots of {slot_size} bytes; at most {} are \
                 supported",
                u32::MAX
            ));
        }
        if queue_depth == 0 || queue_depth > 4096 {
            return config_err(format!("queue_depth {queue_depth} must be between 1 and 4096"));
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| FileStoreError::Os {
                call: "open",
                path: path.display().to_string(),
                detail: e.to_string(),
            })?;
        // From here on, a failure removes the file again.
        let setup = (|| {
            let fd = file.as_raw_fd();
            let al = setup::probe_alignment(fd, &path)?;
            if slot_size % al.offset != 0 {
                return config_err(format!(
                    "slot_size {slot_size} is not a multiple of the direct-I/O offset alignment \
                     {} of {}",
                    al.offset,
                    path.display()
                ));
            }
            setup::preallocate(fd, &path, capacity)?;
            setup::enable_direct(fd, &path)?;
            let backend = setup::make_backend(fd, al, queue_depth, io, &path)?;
            Ok((al, backend))
        })();
        let (al, backend) = match setup {
            Ok(v) => v,
            Err(e) => {
                drop(file);
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
        Ok(FileStore {
            backend,
            file,
            path,
            slot_size,
            al,
            slots: Mutex::new(Slots::new(nslots as u32)),
            punch: AtomicBool::new(true),
            faults: Mutex::new(RandomFaults::default()),
        })
    }

    pub fn io_path(&self) -> IoPath {
        match self.backend {
            Backend::Uring(_) => IoPath::Uring,
            Backend::Threads(_) => IoPath::Threads,
        }
    }

    /// (memory, file offset) alignment that direct I/O on this file needs: caller buffers must
    /// be aligned to the first.
    pub fn alignment(&self) -> (usize, usize) {
        (self.al.mem, self.al.offset)
    }

    pub fn slot_size(&self) -> usize {
        self.slot_size
    }

    pub fn capacity_slots(&self) -> usize {
        self.lock().capacity()
    }

    /// Slots allocated (including any being freed right now).
    pub fn used_slots(&self) -> usize {
        self.lock().used()
    }

    /// `n` slots, contiguous in the file where a free run that long exists (otherwise pieces
    /// of the longest runs), in ascending order. `None` when fewer than `n` are free: then
    /// nothing is taken.
    pub fn alloc(&self, n: usize) -> Option<Vec<FileSlot>> {
        let got = self.lock().alloc(n)?;
        Some(got.into_iter().map(FileSlot).collect())
    }

    /// Frees slots: punches their holes in the file, then makes them allocatable again.
    /// A slot out of range, not allocated, or listed twice is an error that changes nothing.
    /// If punching fails (other than `EOPNOTSUPP`, which is remembered and skipped), the
    /// slots are freed all the same and [`FileStoreError::Punch`] reports the lost space.
    pub fn free(&self, slots: &[FileSlot]) -> Result<(), FileStoreError> {
        self.release(slots, true)
    }

    /// Frees slots for reuse without punching their holes: the disk space stays allocated, so
    /// writing them again overwrites blocks instead of allocating new ones (faster on ext4, and
    /// it cannot hit `ENOSPC`). For slots that will soon be written again.
    pub fn recycle(&self, slots: &[FileSlot]) -> Result<(), FileStoreError> {
        self.release(slots, false)
    }

    fn release(&self, slots: &[FileSlot], punch: bool) -> Result<(), FileStoreError> {
        let mut ids: Vec<u32> = slots.iter().map(|s| s.0).collect();
        self.lock().begin_free(&ids).map_err(|(slot, why)| FileStoreError::BadSlot {
            call: "FileStore::free",
            slot,
            why,
        })?;
        // The slots are `Freeing` now: nobody can allocate them while their holes are punched.
        ids.sort_unstable();
        let mut result = Ok(());
        for (first, count) in slots::runs_of(&ids) {
            if !punch || !self.punch.load(Ordering::Relaxed) {
                break;
            }
            let offset = first as u64 * self.slot_size as u64;
            let len = count as u64 * self.slot_size as u64;
            let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            // SAFETY: plain syscall on our open descriptor; it touches no memory of ours.
            let r = unsafe { libc::fallocate(self.file.as_raw_fd(), mode, offset as libc::off_t, len as libc::off_t) };
            if r != 0 {
                let errno = align::errno();
                if errno == libc::EOPNOTSUPP {
                    self.punch.store(false, Ordering::Relaxed);
                } else if result.is_ok() {
                    result = Err(FileStoreError::Punch {
                        first,
                        last: first + count - 1,
                        offset,
                        len,
                        detail: std::io::Error::from_raw_os_error(errno).to_string(),
                    });
                }
            }
        }
        self.lock().finish_free(&ids);
        result
    }

    /// Writes each `(slot, src)` pair: `slot_size` bytes from `src` to the slot, all slots in
    /// flight at once up to `queue_depth`. Returns when every write has completed (the data
    /// is in the file; no `fdatasync`, see the module documentation) and records each slot's
    /// crc32c. On error (after a failure no further slot is started; which ones had started
    /// depends on timing), every slot either holds its new data, or holds no data (its write
    /// failed), or keeps what it held (not started): a later read never returns wrong bytes.
    /// The error names the first failed slot in `items` order.
    ///
    /// # Safety
    /// Each `src` must point to `slot_size` readable bytes aligned to
    /// [`FileStore::alignment`]`.0` (pinned host memory is page-aligned: fine), which nothing
    /// writes until this returns. The slots must be allocated and distinct.
    pub unsafe fn write(&self, items: &[(FileSlot, *const u8)]) -> Result<(), FileStoreError> {
        const CALL: &str = "FileStore::write";
        let ops = {
            let st = self.lock();
            let mut seen = std::collections::HashSet::with_capacity(items.len());
            let mut ops = Vec::with_capacity(items.len());
            for &(slot, src) in items {
                self.check_slot(&st, CALL, slot)?;
                if !seen.insert(slot.0) {
                    return Err(FileStoreError::BadSlot {
                        call: CALL,
                        slot: slot.0,
                        why: "appears twice in one write".into(),
                    });
                }
                ops.push(self.op(CALL, slot, src.cast_mut())?);
            }
            ops
        };
        // SAFETY: the caller's contract covers every buffer.
        let outcomes = unsafe { self.run(Dir::Write, &ops) };
        let mut st = self.lock();
        for (op, o) in ops.iter().zip(&outcomes) {
            match o {
                Outcome::Done(crc) => st.set_crc(op.slot, Some(*crc)),
                Outcome::NotAttempted => {}
                _ => st.set_crc(op.slot, None),
            }
        }
        drop(st);
        self.first_error(Dir::Write, &ops, &outcomes, &[])
    }

    /// Reads each `(slot, dst)` pair: the slot's `slot_size` bytes into `dst`, all in flight at
    /// once up to `queue_depth`, and checks each slot's crc32c. A slot with no data, a short
    /// read, an I/O error or a checksum mismatch is an error naming the first such slot in
    /// `items` order (with its offset); then no `dst` is claimed to hold its slot's data.
    ///
    /// # Safety
    /// Each `dst` must point to `slot_size` writable bytes aligned to
    /// [`FileStore::alignment`]`.0` that nothing else accesses until this returns; distinct
    /// items must not share bytes.
    pub unsafe fn read(&self, items: &[(FileSlot, *mut u8)]) -> Result<(), FileStoreError> {
        const CALL: &str = "FileStore::read";
        let (ops, expected) = {
            let st = self.lock();
            let mut ops = Vec::with_capacity(items.len());
            let mut expected = Vec::with_capacity(items.len());
            for &(slot, dst) in items {
                match self.check_slot(&st, CALL, slot)? {
                    Some(crc) => expected.push(crc),
                    None => return Err(FileStoreError::NoData { call: CALL, slot: slot.0 }),
                }
                ops.push(self.op(CALL, slot, dst)?);
            }
            (ops, expected)
        };
        // SAFETY: the caller's contract covers every buffer.
        let outcomes = unsafe { self.run(Dir::Read, &ops) };
        self.first_error(Dir::Read, &ops, &outcomes, &expected)
    }

    fn lock(&self) -> MutexGuard<'_, Slots> {
        // The slot map is consistent at every unlock; a panic elsewhere does not spoil it.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Checks that `slot` is allocated; returns its recorded crc.
    fn check_slot(&self, st: &Slots, call: &'static str, slot: FileSlot) -> Result<Option<u32>, FileStoreError> {
        match st.state(slot.0) {
            Some(SlotState::Allocated { crc }) => Ok(crc),
            None => Err(FileStoreError::BadSlot {
                call,
                slot: slot.0,
                why: format!("is out of range (capacity {} slots)", st.capacity()),
            }),
            Some(_) => Err(FileStoreError::BadSlot { call, slot: slot.0, why: "is not allocated".into() }),
        }
    }

    fn op(&self, call: &'static str, slot: FileSlot, buf: *mut u8) -> Result<Op, FileStoreError> {
        if buf.is_null() || !(buf as usize).is_multiple_of(self.al.mem) {
            return Err(FileStoreError::BadBuffer { call, slot: slot.0, addr: buf as usize, align: self.al.mem });
        }
        Ok(Op { slot: slot.0, offset: slot.0 as u64 * self.slot_size as u64, buf, len: self.slot_size })
    }

    /// Evaluates the failpoint once per op up to the first that fires, runs the ops before
    /// it, and returns all outcomes.
    ///
    /// # Safety
    /// As [`FileStore::write`] / [`FileStore::read`] for the ops' buffers.
    unsafe fn run(&self, dir: Dir, ops: &[Op]) -> Vec<Outcome> {
        if ops.is_empty() {
            return Vec::new();
        }
        let mut cut = ops.len();
        let mut injected = None;
        for i in 0..ops.len() {
            let fired = match dir {
                Dir::Write => injected_write(),
                Dir::Read => injected_read(),
            }
            .or_else(|| self.random_fault());
            if let Some(errno) = fired {
                cut = i;
                injected = Some(errno);
                break;
            }
        }
        let mut outcomes = if cut == 0 {
            Vec::new()
        } else {
            match &self.backend {
                // SAFETY: forwarded from our caller.
                Backend::Uring(u) => unsafe { u.run(dir, &ops[..cut]) },
                // SAFETY: forwarded from our caller.
                Backend::Threads(t) => unsafe { t.run(dir, &ops[..cut]) },
            }
        };
        if let Some(errno) = injected {
            outcomes.push(Outcome::Errno { call: self.call_name(dir), errno, done: 0, injected: true });
            outcomes.resize(ops.len(), Outcome::NotAttempted);
        }
        outcomes
    }

    /// `EIO` for an op that [`FileStore::inject_errors`] makes fail.
    fn random_fault(&self) -> Option<i32> {
        let mut faults = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        faults.fires().then_some(libc::EIO)
    }

    /// For tests: from now on about one read or write op in `one_in` fails with `EIO` (as the
    /// failpoints do, but for this store only), the same ops for the same `seed`; `None` stops it.
    pub fn inject_errors(&self, one_in: Option<u64>, seed: u64) {
        *self.faults.lock().unwrap_or_else(|p| p.into_inner()) = RandomFaults::new(one_in, seed);
    }

    fn call_name(&self, dir: Dir) -> &'static str {
        match (&self.backend, dir) {
            (Backend::Uring(_), Dir::Read) => "IORING_OP_READ",
            (Backend::Uring(_), Dir::Write) => "IORING_OP_WRITE",
            (Backend::Threads(_), Dir::Read) => "pread",
            (Backend::Threads(_), Dir::Write) => "pwrite",
        }
    }

    /// The error for the first op (in order) that failed or, for reads, whose crc differs
    /// from `expected`.
    fn first_error(&self, dir: Dir, ops: &[Op], outcomes: &[Outcome], expected: &[u32]) -> Result<(), FileStoreError> {
        for (i, (op, o)) in ops.iter().zip(outcomes).enumerate() {
            let (slot, offset, len) = (op.slot, op.offset, op.len);
            match *o {
                Outcome::Done(crc) => {
                    if dir == Dir::Read && crc != expected[i] {
                        return Err(FileStoreError::Checksum { slot, offset, stored: expected[i], read: crc });
                    }
                }
                Outcome::NotAttempted => {}
                Outcome::Short { done } => {
                    return Err(match dir {
                        Dir::Read => FileStoreError::ShortRead { slot, offset, done, len },
                        Dir::Write => FileStoreError::ShortWrite { slot, offset, done, len },
                    })
                }
                Outcome::Errno { call, errno, done, injected } => {
                    let mut detail = std::io::Error::from_raw_os_error(errno).to_string();
                    if done > 0 {
                        detail = format!("{detail} after {done} of {len} bytes");
                    }
                    if injected {
                        detail.push_str(" [injected: failpoint or inject_errors]");
                    }
                    let no_space = matches!(errno, libc::ENOSPC | libc::EDQUOT | libc::EFBIG);
                    return Err(if dir == Dir::Write && no_space {
                        FileStoreError::NoSpace { call, slot, offset, errno, detail }
                    } else {
                        FileStoreError::Io { call, slot, offset, errno, detail }
                    });
                }
            }
        }
        // Ops are only left unattempted after another op failed, which returned above.
        debug_assert!(outcomes.iter().all(|o| matches!(o, Outcome::Done(_))));
        Ok(())
    }
}

impl Drop for FileStore {
    fn drop(&mut self) {
        // No call is running (`drop` has `&mut self`). The backend goes before the descriptor
        // (field order); the file goes now: its bytes mean nothing without our checksums.
        let _ = std::fs::remove_file(&self.path);
    }
}

fn config_err<T>(msg: String) -> Result<T, FileStoreError> {
    Err(FileStoreError::Config(msg))
}

fn injected_write() -> Option<i32> {
    fail::fail_point!("file_store::write", |arg: Option<String>| Some(
        arg.and_then(|s| s.trim().parse().ok()).unwrap_or(libc::EIO)
    ));
    None
}

fn injected_read() -> Option<i32> {
    fail::fail_point!("file_store::read", |arg: Option<String>| Some(
        arg.and_then(|s| s.trim().parse().ok()).unwrap_or(libc::EIO)
    ));
    None
}
