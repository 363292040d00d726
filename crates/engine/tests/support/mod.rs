//! Shared helpers: an engine over the simulated device (or the real GPU when
//! `TIERMEM_TEST_BACKEND=cuda`), and deterministic byte patterns.
#![allow(dead_code)]

use std::sync::Arc;
use tiermem::mechanism::{sim::SimDevice, BackendChoice, Device};
use tiermem::{Engine, EngineConfig};

pub const MIB: usize = 1 << 20;
pub const CHUNK: usize = 2 * MIB;

/// An engine with an HBM cap of `hbm_chunks` and a host tier of `host_chunks`. On the
/// simulated device the `SimDevice` is returned too, to check for leaks after the engine is dropped.
pub fn engine(hbm_chunks: usize, host_chunks: usize, config: EngineConfig) -> (Engine, Option<Arc<SimDevice>>) {
    let config = EngineConfig {
        hbm_limit: Some(hbm_chunks * CHUNK),
        host_limit: Some(host_chunks * CHUNK),
        ..config
    };
    match std::env::var("TIERMEM_TEST_BACKEND").as_deref() {
        Ok("cuda") => {
            let engine = Engine::new(EngineConfig { backend: BackendChoice::Cuda, ..config }).expect("open the GPU");
            (engine, None)
        }
        _ => {
            let sim = Arc::new(SimDevice::new((hbm_chunks + 4) * CHUNK).expect("simulated device"));
            let device: Arc<dyn Device> = sim.clone();
            (Engine::with_device(device, &config).expect("engine"), Some(sim))
        }
    }
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
