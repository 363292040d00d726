//! Shared helpers: an engine over the simulated device (or the real GPU when
//! `TIERMEM_TEST_BACKEND=cuda`), and deterministic byte patterns.
#![allow(dead_code)]

#[cfg(feature = "failpoints")]
pub mod failpoints;

use std::sync::Arc;
use tiermem::mechanism::{sim::SimDevice, BackendChoice, Device};
use tiermem::Tier;
use tiermem::{Engine, EngineConfig, PeerChoice};

pub const MIB: usize = 1 << 20;
pub const CHUNK: usize = 2 * MIB;

/// The engine's defaults with chunks of one granule ([`CHUNK`]), which these tests count in.
pub fn config() -> EngineConfig {
    EngineConfig { chunk: Some(CHUNK), ..EngineConfig::default() }
}

/// An engine with an HBM cap of `hbm_chunks` and a host tier of `host_chunks`. On the
/// simulated device the `SimDevice` is returned too, to check for leaks after the engine is dropped.
pub fn engine(hbm_chunks: usize, host_chunks: usize, config: EngineConfig) -> (Engine, Option<Arc<SimDevice>>) {
    let config = EngineConfig { hbm_limit: Some(hbm_chunks * CHUNK), host_limit: Some(host_chunks * CHUNK), ..config };
    match std::env::var("TIERMEM_TEST_BACKEND").as_deref() {
        Ok("cuda") => {
            // These tests are about HBM, host and file: on a machine of several GPUs no
            // neighbour lends (the peer tier's tests run on a simulated node).
            let config = EngineConfig { backend: BackendChoice::Cuda, peers: PeerChoice::Off, ..config };
            let engine = Engine::new(config).expect("open the GPU");
            (engine, None)
        }
        _ => {
            let sim = Arc::new(SimDevice::new((hbm_chunks + 4) * CHUNK).expect("simulated device"));
            let device: Arc<dyn Device> = sim.clone();
            (Engine::with_device(device, &config).expect("engine"), Some(sim))
        }
    }
}

/// An engine on GPU 0 of a simulated node of three GPUs, whose neighbours (GPUs 1 and 2)
/// each lend `peer_chunks` chunks: their HBM is that plus a reserve of 8 chunks kept free.
pub fn engine_with_peers(
    hbm_chunks: usize,
    host_chunks: usize,
    peer_chunks: usize,
    config: EngineConfig,
) -> (Engine, Arc<SimDevice>) {
    const RESERVE: usize = 8;
    let per_gpu = (hbm_chunks + 4).max(peer_chunks + RESERVE);
    let config = EngineConfig {
        hbm_limit: Some(hbm_chunks * CHUNK),
        host_limit: Some(host_chunks * CHUNK),
        peer_reserve: Some(RESERVE * CHUNK + (per_gpu - peer_chunks - RESERVE) * CHUNK),
        ..config
    };
    let mut node = SimDevice::node(3, per_gpu * CHUNK).expect("simulated node");
    let sim = Arc::new(node.swap_remove(0));
    let device: Arc<dyn Device> = sim.clone();
    (Engine::with_device(device, &config).expect("engine"), sim)
}

/// A fresh path for a file tier: in `TIERMEM_TEST_FILE_DIR` (it must allow `O_DIRECT`),
/// else the temporary directory.
pub fn file_tier_path(name: &str) -> std::path::PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir = std::env::var_os("TIERMEM_TEST_FILE_DIR").map_or_else(std::env::temp_dir, Into::into);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    dir.join(format!("tiermem-test-{name}-{}-{n}", std::process::id()))
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

/// Drops the engine and asserts the simulated device got everything back.
pub fn assert_no_leaks(engine: Engine, sim: Option<Arc<SimDevice>>) {
    drop(engine);
    if let Some(sim) = sim {
        let live = sim.live();
        assert!(live.is_empty(), "resources still held after the engine was dropped: {live:?}");
    }
}

/// An engine over a simulated device of `sim_chunks` chunks whatever `TIERMEM_TEST_BACKEND`
/// says: for tests that need the simulated device (failpoints, leak counts, a device smaller
/// than the HBM cap).
pub fn sim_engine(
    sim_chunks: usize,
    hbm_chunks: usize,
    host_chunks: usize,
    config: EngineConfig,
) -> (Engine, Arc<SimDevice>) {
    let config = EngineConfig { hbm_limit: Some(hbm_chunks * CHUNK), host_limit: Some(host_chunks * CHUNK), ..config };
    let sim = Arc::new(SimDevice::new(sim_chunks * CHUNK).expect("simulated device"));
    let device: Arc<dyn Device> = sim.clone();
    (Engine::with_device(device, &config).expect("engine"), sim)
}

/// Writes `pattern(seed, size)` into `buffer` one chunk at a time (so a buffer larger than
/// the HBM cap can be filled) and returns the bytes written.
pub fn fill(engine: &Engine, buffer: tiermem::BufferId, size: usize, seed: u64) -> Vec<u8> {
    let data = pattern(seed, size);
    for offset in (0..size).step_by(CHUNK) {
        let end = (offset + CHUNK).min(size);
        engine.write(buffer, offset, &data[offset..end]).unwrap_or_else(|e| panic!("fill {buffer} at {offset}: {e}"));
    }
    data
}

/// Reads `buffer` one chunk at a time and asserts it holds exactly `expected`.
pub fn assert_contents(engine: &Engine, buffer: tiermem::BufferId, expected: &[u8]) {
    let mut out = vec![0u8; CHUNK];
    for offset in (0..expected.len()).step_by(CHUNK) {
        let len = CHUNK.min(expected.len() - offset);
        engine.read(buffer, offset, &mut out[..len]).unwrap_or_else(|e| panic!("read {buffer} at {offset}: {e}"));
        if out[..len] != expected[offset..offset + len] {
            let first = (0..len).find(|&i| out[i] != expected[offset + i]).unwrap();
            panic!(
                "buffer {buffer}: byte {} is 0x{:02x}, expected 0x{:02x}",
                offset + first,
                out[first],
                expected[offset + first]
            );
        }
    }
}

/// The per-buffer statistics of `buffer`.
pub fn buffer_stats(engine: &Engine, buffer: tiermem::BufferId) -> tiermem::BufferStats {
    engine.stats().buffers.into_iter().find(|b| b.id == buffer).unwrap_or_else(|| panic!("no stats for {buffer}"))
}

/// Chunks acquired across all buffers.
pub fn acquired_chunks(engine: &Engine) -> usize {
    engine.stats().buffers.iter().map(|b| b.acquired).sum()
}

/// HBM chunks in use must be exactly those the buffers hold (none lost by a rollback).
pub fn assert_hbm_accounted(engine: &Engine) {
    let stats = engine.stats();
    let held: usize = stats.buffers.iter().map(|b| b.in_hbm + b.moving).sum();
    assert_eq!(stats.tiers[Tier::Hbm].chunks, held, "HBM chunks in use but owned by no chunk: {stats}");
    assert_summary_agrees(engine);
}

/// `Engine::summary` (what the daemon's link reads) says what the per-buffer statistics add up
/// to. Valid while nothing moves (between engine calls of one thread).
pub fn assert_summary_agrees(engine: &Engine) {
    let (stats, summary) = (engine.stats(), engine.summary());
    assert!(summary.buffers.is_empty(), "a summary has no per-buffer residency");
    assert_eq!(summary.tiers, stats.tiers);
    assert_eq!(summary.allocated_chunks, stats.buffers.iter().map(|b| b.chunks).sum::<usize>());
    let acquired: usize = stats.buffers.iter().map(|b| b.acquired).sum();
    match stats.buffers.iter().any(|b| b.in_peer > 0) {
        // Those read in place from a neighbour's HBM are acquired, but not in HBM.
        true => assert!(summary.acquired_in_hbm <= acquired),
        false => assert_eq!(summary.acquired_in_hbm, acquired, "{stats}"),
    }
    assert_eq!((summary.allocated_chunks, summary.acquired_in_hbm), (stats.allocated_chunks, stats.acquired_in_hbm));
}
