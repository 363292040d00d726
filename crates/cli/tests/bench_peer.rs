//! `tiermem bench peer` end to end on a simulated node of two GPUs, small: the raw copies,
//! the lender's job, tiermem's page-out to the lender, page-in, a kernel reading in place and
//! both reclaims run and are verified, and the report has every key the issue asks for. The numbers mean nothing here.

mod support;

#[test]
fn the_peer_benchmark_runs_on_a_simulated_node_and_verifies_every_byte() {
    let dir = support::TempDir::new("bench-peer");
    let output = support::tiermem()
        .args([
            "bench",
            "peer",
            "--size",
            "32MiB",
            "--reps",
            "2",
            "--job-bytes",
            "32MiB",
            "--job-seconds",
            "0.3",
            "--json",
        ])
        .arg(&dir.0)
        .env("TIERMEM_BACKEND", "sim")
        .env("TIERMEM_COMMIT", "test")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&output.stdout).to_string() + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "bench peer failed:\n{log}");
    assert!(log.contains("SIMULATED"), "the simulated device is said loudly:\n{log}");
    let report = std::fs::read_dir(&dir.0)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with("-test.json"))
        .expect("the report");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(report["verified"], true, "{report}");
    for key in [
        "raw_peer_GBps",
        "page_in_from_peer_GBps",
        "page_out_to_peer_GBps",
        "in_place_read_GBps",
        "raw_in_place_read_GBps",
        "reclaim_ms_per_GiB_clean",
        "reclaim_ms_per_GiB_dirty",
        "decode_tok_s_peer",
        "decode_tok_s_host_only",
        "decode_tok_s_resident",
        "multipath_h2d_GBps",
        "lender_slowdown",
        "lender_slowdown_unheld",
    ] {
        assert!(report["metrics"].get(key).is_some(), "{key} missing: {report}");
    }
    for key in ["page_in_peer", "page_out_peer", "in_place", "decode_vs_host_only", "multipath_vs_single"] {
        assert!(report["ratios"].get(key).is_some(), "{key} missing: {report}");
    }
    assert!(report["metrics"]["reclaim_ms_per_GiB_dirty"].as_f64().is_some(), "{report}");
    for key in ["in_place_read_GBps", "raw_in_place_read_GBps"] {
        assert!(report["metrics"][key].as_f64().is_some_and(|v| v > 0.0), "{key}: {report}");
    }
}
