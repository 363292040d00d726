//! Helpers of the link's tests: a socket in a fresh folder, an engine on the simulated device.

#![allow(dead_code)] // each test file uses some of these

use std::path::PathBuf;
use std::sync::Arc;
use tiermem::{Engine, EngineConfig};

/// A socket path in a fresh folder named after the test (`name`) and this process.
pub fn socket(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tiermem-link-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("d.sock")
}

/// An engine on a simulated GPU of 64 MiB, all of it its cap, with 256 MiB of host memory.
pub fn engine() -> Arc<Engine> {
    let config = EngineConfig {
        backend: "sim".parse().unwrap(),
        hbm_limit: Some(64 << 20),
        sim_hbm: 64 << 20,
        host_limit: Some(256 << 20),
        ..EngineConfig::default()
    };
    Arc::new(Engine::new(config).unwrap())
}
