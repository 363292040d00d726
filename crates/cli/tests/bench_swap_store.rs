//! `tiermem bench swap-store` end to end on the simulated device, small: the store is filled,
//! every timed read is checked, the steps run with and without learned loops, and the report
//! has the keys the GPU run is read for. The numbers mean nothing here.

mod support;

#[test]
fn the_swap_store_benchmark_runs_on_the_simulated_device_and_verifies_every_read() {
    let dir = support::TempDir::new("bench-swap-store");
    let output = support::tiermem()
        .args(["bench", "swap-store", "--size", "64MiB", "--ops", "200", "--commit", "abcdef0123", "--json"])
        .arg(&dir.0)
        .env("TIERMEM_BACKEND", "sim")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&output.stdout).to_string() + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "bench swap-store failed:\n{log}");
    assert!(log.contains("SIMULATED"), "the simulated device is said loudly:\n{log}");
    let report = std::fs::read_dir(&dir.0)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            name.starts_with("vramswap-store-") && name.ends_with("-abcdef0.json")
        })
        .expect("the report, named vramswap-store-<date>-<shortsha>.json");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(report["suite"], "vramswap-store", "{report}");
    assert_eq!(report["commit"], "abcdef0123", "{report}");
    assert_eq!(report["verified"], true, "{report}");
    assert!(report["date"].as_str().is_some_and(|d| d.len() == 10), "{report}");
    assert!(report["device"]["name"].as_str().is_some(), "{report}");
    let metrics = &report["metrics"];
    for key in [
        "read32k_lat_us_mean",
        "read32k_lat_us_p50",
        "read32k_lat_us_p99",
        "read4k_lat_us_p50",
        "read4k_lat_us_p99",
        "write4k_lat_us_p50",
        "write4k_lat_us_p99",
        "read32k_8threads_lat_us_p50",
        "read32k_8threads_lat_us_p99",
        "read32k_8threads_kops",
        "step_acquire_us_p50",
        "step_copy_async_us_p50",
        "step_sync_us_p50",
        "step_release_us_p50",
        "step_memcpy_us_p50",
        "step_total_us_p50",
        "raw_copy_sync_us_p50",
        "idle_sync_us_p50",
        "store_overhead_us_p50",
        "read32k_learn_off_lat_us_p50",
    ] {
        assert!(metrics[key].as_f64().is_some_and(|v| v.is_finite()), "{key}: {report}");
    }
    assert_eq!(metrics["hbm_resident_fraction"], 1.0, "the whole device sits in HBM: {report}");
    assert!(metrics["read32k_8threads_kops"].as_f64().unwrap() > 0.0, "{report}");
    for section in ["learn_loops_on", "learn_loops_off"] {
        for key in ["read32k_lat_us_p50", "read32k_lat_us_p99", "step_acquire_us_p50", "step_sync_us_p50"] {
            assert!(report[section][key].as_f64().is_some(), "{section}.{key}: {report}");
        }
    }
    assert!(report["learn_loops_on"]["learn_loops_bytes"].as_u64().is_some(), "{report}");
    assert!(report["learn_loops_off"]["learn_loops_bytes"].is_null(), "{report}");
}
