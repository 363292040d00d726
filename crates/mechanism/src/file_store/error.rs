/// Errors of the file store. Every message names the call or operation that failed and, for
/// I/O, the slot and its byte offset in the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileStoreError {
    /// A configuration value is unusable (sizes, alignment, queue depth, a filesystem
    /// without `O_DIRECT`).
    #[error("file store configuration: {0}")]
    Config(String),
    /// A call on the file as a whole failed (`open`, `statx`, `fallocate`, `io_uring_setup`, …).
    #[error("{call} failed on {path}: {detail}")]
    Os { call: &'static str, path: String, detail: String },
    /// A read or write of one slot failed with an error code.
    #[error("{call} failed on slot {slot} (offset {offset}): {detail}")]
    Io { call: &'static str, slot: u32, offset: u64, errno: i32, detail: String },
    /// A write found no room: `ENOSPC`, `EDQUOT`, or `EFBIG` (file size limit). The bytes the
    /// caller passed were only read, so nothing is lost; the slot holds no data afterwards.
    #[error(
        "{call} failed on slot {slot} (offset {offset}): {detail}: the file cannot take the data \
         (the caller's bytes are untouched)"
    )]
    NoSpace { call: &'static str, slot: u32, offset: u64, errno: i32, detail: String },
    /// The file ended inside the slot.
    #[error("short read on slot {slot} (offset {offset}): {done} of {len} bytes (file truncated?)")]
    ShortRead { slot: u32, offset: u64, done: usize, len: usize },
    /// The file accepted only part of the slot and then nothing more.
    #[error(
        "short write on slot {slot} (offset {offset}): {done} of {len} bytes \
         (filesystem full or file size limit?)"
    )]
    ShortWrite { slot: u32, offset: u64, done: usize, len: usize },
    /// The bytes read are not the bytes written.
    #[error(
        "checksum mismatch on slot {slot} (offset {offset}): stored 0x{stored:08x}, \
         read 0x{read:08x} (the file was changed underneath)"
    )]
    Checksum { slot: u32, offset: u64, stored: u32, read: u32 },
    /// A read of a slot that has no recorded contents.
    #[error("{call}: slot {slot} holds no data (never written, freed, or its last write failed)")]
    NoData { call: &'static str, slot: u32 },
    /// A slot that is out of range, not allocated, or given twice where that is not allowed.
    #[error("{call}: slot {slot} {why}")]
    BadSlot { call: &'static str, slot: u32, why: String },
    /// A caller buffer that `O_DIRECT` cannot use.
    #[error(
        "{call}: buffer 0x{addr:x} for slot {slot} is not aligned to {align} bytes \
         (O_DIRECT needs aligned memory)"
    )]
    BadBuffer { call: &'static str, slot: u32, addr: usize, align: usize },
    /// Giving the disk space of freed slots back failed. The slots are free nonetheless.
    #[error(
        "fallocate(PUNCH_HOLE) failed on slots {first}..={last} (offset {offset}, {len} bytes): \
         {detail}; the slots are free, but their disk space may not have been returned"
    )]
    Punch { first: u32, last: u32, offset: u64, len: u64, detail: String },
    /// What a caller reports when [`FileStore::alloc`](super::FileStore::alloc) returns `None`
    /// (the store itself answers `None`, having taken nothing).
    #[error("file store full: {used} slots of {capacity} in use")]
    Full { used: usize, capacity: usize },
}

impl FileStoreError {
    /// The operating-system error code behind an I/O error, if there is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            FileStoreError::Io { errno, .. } | FileStoreError::NoSpace { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    pub(super) fn os(call: &'static str, path: &std::path::Path, errno: i32) -> Self {
        FileStoreError::Os {
            call,
            path: path.display().to_string(),
            detail: std::io::Error::from_raw_os_error(errno).to_string(),
        }
    }
}
