//! The swap server's store as a tenant of an in-process node daemon (`TIERMEM_DAEMON` names its
//! socket): the daemon's grant caps the store's HBM, a second tenant halves it (the store's
//! data moves down and every byte survives), a cap forced by `tiermem swap cap` and the grant
//! combine (the smaller holds), and the grant grows back when the other tenant leaves.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiermem::{AllocOptions, Engine, EngineConfig};
use tiermem_swap::control::RunDir;
use tiermem_swap::serve::{open_store, ServeConfig, StoreKind};
use tiermem_tenant::DaemonLink;

const MIB: u64 = 1 << 20;

/// A daemon on `path` sharing `hbm` of GPU 0, until the handle is dropped (it then closes every
/// connection, as a daemon that exits does).
fn start_daemon(path: &std::path::Path, hbm: &str) -> tiermem_daemon::Spawned {
    let config = tiermem_daemon::Config::parse(&format!("[[gpu]]\nindex = 0\nhbm = \"{hbm}\""), "test").unwrap();
    tiermem_daemon::spawn(path, config).unwrap()
}

/// Waits until `condition` holds of the store's HBM cap (`None` on timeout).
fn wait_for_cap(report: impl Fn() -> Option<u64>, condition: impl Fn(Option<u64>) -> bool) -> Option<u64> {
    wait_for(report, |cap| condition(*cap))
}

/// `report()` once `condition` holds of it, or its last value after 20 s.
fn wait_for<T>(report: impl Fn() -> T, condition: impl Fn(&T) -> bool) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let value = report();
        if condition(&value) || Instant::now() > deadline {
            return value;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_daemon_leases_the_swap_store_and_a_forced_cap_combines_with_its_grant() {
    let dir = std::env::temp_dir().join(format!("tiermem-swap-daemon-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("d.sock");
    let _daemon = start_daemon(&socket, "64MiB");
    // This test binary is the only user of these variables.
    std::env::set_var("TIERMEM_DAEMON", &socket);
    std::env::set_var("TIERMEM_BACKEND", "sim");
    std::env::set_var("TIERMEM_SIM_HBM", "512MiB");

    let config = ServeConfig {
        size: 64 * MIB,
        gpu: 0,
        priority: 100,
        spill: dir.join("spill"),
        spill_size: 128 * MIB,
        devices: 1,
        soft_limit: Some(0),
        hard_limit: Some(0),
        enable: false,
        attach_loops: false,
        threads: 1,
        store: StoreKind::Engine,
        run_dir: RunDir::new(dir.join("run")),
        notify_fd: None,
    };
    let store = open_store(&config, 64 * MIB).expect("open the store");
    let report = || store.control.report();
    let daemon = report().daemon.expect("a tenant of the daemon");
    assert_eq!(daemon["connected"], true, "{daemon}");
    let cap = || report().cap_bytes;
    assert_eq!(wait_for_cap(cap, |c| c == Some(64 * MIB)), Some(64 * MIB), "alone, the store gets the whole GPU");

    // 48 MiB of data, then a second tenant that wants everything: the store's share halves.
    let data: Vec<u8> = (0..48 * MIB as usize).map(|i| (i * 7 % 251) as u8).collect();
    store.blocks.write(0, &data).unwrap();
    let other = Arc::new(
        Engine::new(EngineConfig {
            backend: "sim".parse().unwrap(),
            hbm_limit: Some(64 << 20),
            sim_hbm: 512 << 20,
            host_limit: Some(64 << 20),
            ..EngineConfig::default()
        })
        .unwrap(),
    );
    let link = DaemonLink::attach(&other, socket.clone(), None).unwrap();
    let (_buffer, _) = other.alloc(48 << 20, AllocOptions::default()).unwrap();
    assert_eq!(wait_for_cap(cap, |c| c == Some(32 * MIB)), Some(32 * MIB), "the daemon halves the store's share");
    // The new cap is reported at once; the chunks beyond it leave as their copies land.
    let met = wait_for(report, |r| r.hbm_bytes <= 32 * MIB);
    assert!(met.hbm_bytes <= 32 * MIB, "the store met its grant: {met:?}");
    let mut back = vec![0u8; data.len()];
    store.blocks.read(0, &mut back).unwrap();
    assert!(back == data, "every byte survived the cut");

    // A forced cap below the grant holds; lifted, the grant holds again.
    store.control.set_cap(Some(8 * MIB)).unwrap();
    assert_eq!(report().cap_bytes, Some(8 * MIB));
    store.control.set_cap(None).unwrap();
    assert_eq!(report().cap_bytes, Some(32 * MIB), "the grant, not no cap");

    // The other tenant leaves: the store's grant grows back.
    link.end();
    drop(other);
    assert_eq!(wait_for_cap(cap, |c| c == Some(64 * MIB)), Some(64 * MIB), "the share comes back");
    store.blocks.read(0, &mut back).unwrap();
    assert!(back == data);
    drop(store);
    let _ = std::fs::remove_dir_all(PathBuf::from(&dir));
}
