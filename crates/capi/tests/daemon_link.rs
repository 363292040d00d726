//! The process engine (`tiermem_init`) leases its HBM from the node daemon when one runs
//! (`TIERMEM_DAEMON`), and `tiermem_shutdown` ends the lease. Its own test binary: the process
//! engine and the environment are process-wide.

use std::time::{Duration, Instant};
use tiermem::EngineConfig;

#[test]
fn the_process_engine_leases_its_budget_from_the_daemon() {
    let dir = std::env::temp_dir().join(format!("tiermem-capi-daemon-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let socket = dir.join("d.sock");
    let config = tiermem_daemon::Config::parse("[[gpu]]\nindex = 0\nhbm = \"24MiB\"", "test").unwrap();
    let _daemon = tiermem_daemon::spawn(&socket, config).unwrap();
    std::env::set_var("TIERMEM_DAEMON", &socket);

    let engine = tiermem_capi::init(EngineConfig {
        backend: "sim".parse().unwrap(),
        hbm_limit: Some(64 << 20),
        sim_hbm: 64 << 20,
        host_limit: Some(64 << 20),
        ..EngineConfig::default()
    })
    .unwrap();
    // init waited for the first budget: the engine starts within it.
    assert_eq!(engine.hbm_cap(), 24 << 20);
    let tenants = |count: usize| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let report = tiermem_tenant::query_status(&socket).unwrap();
            if report.tenants.len() == count {
                return report;
            }
            assert!(Instant::now() < deadline, "expected {count} tenants: {report:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    assert_eq!(tenants(1).tenants[0].pid, std::process::id());
    drop(engine);
    tiermem_capi::shutdown().unwrap();
    tenants(0);
    let _ = std::fs::remove_dir_all(&dir);
}
