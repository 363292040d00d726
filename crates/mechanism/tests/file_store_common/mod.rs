//! Helpers shared by the `file_store_*` tests: aligned buffers, random bytes, scratch paths,
//! and opening a store on a chosen I/O path (skipping io_uring where it is refused).
#![allow(dead_code)]

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use tiermem_mechanism::file_store::{FileStore, FileStoreConfig, FileStoreError, IoChoice};

/// Heap memory aligned to 4096 bytes, as `O_DIRECT` wants it (pinned host slots are too).
pub struct AlignedBuf {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: the buffer is plain owned heap memory.
unsafe impl Send for AlignedBuf {}
// SAFETY: through `&AlignedBuf` the bytes are only read.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub fn new(len: usize) -> Self {
        let layout = Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: `len` is non-zero in every test.
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "allocation of {len} bytes failed");
        AlignedBuf { ptr, layout }
    }
    pub fn random(len: usize, seed: u64) -> Self {
        let mut b = Self::new(len);
        fill_random(b.as_mut_slice(), seed);
        b
    }
    pub fn ptr(&self) -> *const u8 {
        self.ptr
    }
    pub fn mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` owns `layout.size()` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.layout.size()) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

/// xorshift64*: deterministic bytes without a dependency.
pub fn fill_random(buf: &mut [u8], seed: u64) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let v = x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
}

/// A fresh path under `TIERMEM_FS_TEST_DIR` or else the cargo target's scratch directory
/// (ext4 on the development machines: O_DIRECT works).
pub fn scratch(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let base = std::env::var_os("TIERMEM_FS_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    let dir = base.join("file_store");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{name}-{}-{}.slots", std::process::id(), N.fetch_add(1, Ordering::Relaxed)))
}

pub fn config(name: &str, slots: usize, slot_size: usize, io: IoChoice) -> FileStoreConfig {
    FileStoreConfig { path: scratch(name), capacity: slots * slot_size, slot_size, queue_depth: 8, io }
}

/// The explicit I/O paths to test.
pub const PATHS: [IoChoice; 2] = [IoChoice::Uring, IoChoice::Threads];

/// Opens a store; `None` (with the reason printed) when io_uring was asked for and refused here.
pub fn open(cfg: FileStoreConfig) -> Option<FileStore> {
    let io = cfg.io;
    match FileStore::open(cfg) {
        Ok(s) => {
            eprintln!("file store on {}: alignment {:?}", s.io_path(), s.alignment());
            Some(s)
        }
        Err(e @ FileStoreError::Os { call: "io_uring_setup", .. }) if io == IoChoice::Uring => {
            eprintln!("SKIPPED the io_uring path: {e}");
            None
        }
        Err(e) => panic!("FileStore::open: {e}"),
    }
}

/// Writes one slot from a buffer.
pub fn write_one(
    store: &FileStore,
    slot: tiermem_mechanism::file_store::FileSlot,
    buf: &AlignedBuf,
) -> Result<(), FileStoreError> {
    // SAFETY: `buf` is 4096-aligned, at least slot_size long, and borrowed for the call.
    unsafe { store.write(&[(slot, buf.ptr())]) }
}

/// Reads one slot into a buffer.
pub fn read_one(
    store: &FileStore,
    slot: tiermem_mechanism::file_store::FileSlot,
    buf: &mut AlignedBuf,
) -> Result<(), FileStoreError> {
    // SAFETY: `buf` is 4096-aligned, at least slot_size long, and mutably borrowed for the call.
    unsafe { store.read(&[(slot, buf.mut_ptr())]) }
}
