//! Shared helpers: a store over the simulated device with a file tier in the temporary
//! directory (or `TIERMEM_TEST_FILE_DIR`), a reference model, and byte patterns.
#![allow(dead_code)]

use std::path::PathBuf;
use tiermem::mechanism::BackendChoice;
use tiermem_swap::{Blocks, Limits, StoreConfig, VramStore, PAGE};

pub const MIB: u64 = 1 << 20;
pub const CHUNK: u64 = 2 * MIB;

/// A fresh path for a spill file.
pub fn spill_path(name: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir = std::env::var_os("TIERMEM_TEST_FILE_DIR").map_or_else(std::env::temp_dir, Into::into);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    dir.join(format!("tiermem-swap-test-{name}-{}-{n}", std::process::id()))
}

/// Limits under which the store takes the whole simulated GPU (no one else is on it) and
/// keeps at least `min_chunks`.
pub fn greedy(min_chunks: u64) -> Limits {
    Limits { soft_free: 0, hard_free: 0, grow_margin: 0, min_budget: min_chunks * CHUNK }
}

/// A device of `size` bytes over a simulated GPU of `gpu_chunks` chunks, a host staging tier of
/// `host_chunks` and a spill file of `file_chunks`; no monitor thread.
pub fn config(name: &str, size: u64, gpu_chunks: u64, host_chunks: u64, file_chunks: u64) -> StoreConfig {
    let mut config = StoreConfig::new(size, Some(spill_path(name)));
    config.engine.backend = BackendChoice::Sim;
    config.engine.sim_hbm = (gpu_chunks * CHUNK) as usize;
    config.engine.host_limit = Some((host_chunks * CHUNK) as usize);
    config.engine.file_limit = (file_chunks * CHUNK) as usize;
    config.engine.batch_chunks = 2;
    config.limits = greedy(2);
    config.poll = None;
    config
}

pub fn open(config: StoreConfig) -> VramStore {
    VramStore::open(config).expect("open the store")
}

/// `len` bytes that depend on `seed` and on each byte's position.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// What the device should hold: its bytes and which pages are present.
pub struct Model {
    pub bytes: Vec<u8>,
    pub present: Vec<bool>,
}

impl Model {
    pub fn new(size: u64) -> Self {
        Self { bytes: vec![0; size as usize], present: vec![false; (size / PAGE) as usize] }
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) {
        self.bytes[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        let end = offset + data.len() as u64;
        for page in offset / PAGE..end.div_ceil(PAGE) {
            self.present[page as usize] = true;
        }
    }

    /// Discarded bytes read as zeros; pages covered whole are no longer present.
    pub fn discard(&mut self, offset: u64, len: u64) {
        self.bytes[offset as usize..(offset + len) as usize].fill(0);
        for page in offset.div_ceil(PAGE)..(offset + len) / PAGE {
            self.present[page as usize] = false;
        }
    }

    pub fn bytes_present(&self) -> u64 {
        self.present.iter().filter(|&&p| p).count() as u64 * PAGE
    }

    pub fn areas_live(&self, area_size: u64) -> u64 {
        self.present.chunks((area_size / PAGE) as usize).filter(|area| area.iter().any(|&p| p)).count() as u64
    }
}

/// Reads the whole device in 1 MiB pieces and compares every byte with `expected`.
pub fn assert_device_holds(store: &VramStore, expected: &[u8]) {
    let mut back = vec![0u8; MIB as usize];
    for (i, want) in expected.chunks(MIB as usize).enumerate() {
        let out = &mut back[..want.len()];
        store.read(i as u64 * MIB, out).expect("read back");
        if out != want {
            let at = out.iter().zip(want).position(|(a, b)| a != b).unwrap();
            panic!("byte {} differs: read {}, expected {}", i as u64 * MIB + at as u64, out[at], want[at]);
        }
    }
}
