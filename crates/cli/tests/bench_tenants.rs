//! `tiermem bench tenants` end to end on the simulated device, small: every scenario runs
//! (static caps, tiermemd fair and in turns, serial, hog, leak, idle, pairs, fair share, reclaim), every tenant's
//! bytes are checked by its kernels, and the report says so. The numbers mean nothing here.

mod support;

#[test]
fn the_tenants_benchmark_runs_every_scenario_and_verifies_every_byte() {
    let dir = support::TempDir::new("bench-tenants");
    let output = support::tiermem()
        .args(["bench", "tenants", "--cap", "64MiB", "--buffer-size", "4MiB", "--rounds", "1", "--think-ms", "0"])
        .args(["--repeats", "2"])
        .arg("--json")
        .arg(&dir.0)
        .env("TIERMEM_BACKEND", "sim")
        .env("TIERMEM_COMMIT", "test")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&output.stdout).to_string() + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "bench tenants failed:\n{log}");
    let report = json_ending(&dir.0, "-test.json");
    assert_eq!(report["verified"], true, "{report}");
    assert_eq!(report["metrics"]["leak_victims_finished"], true, "{report}");
    assert_eq!(report["metrics"]["pairs_finished"], report["metrics"]["pairs"], "{report}");
    assert!(report["metrics"]["fair_share_error"].as_f64().unwrap() <= 0.05, "{report}");
    assert!(report["metrics"]["idle_lender_others_speed"].as_f64().unwrap() > 0.0, "{report}");
    for key in ["vs_static", "vs_serial", "working_sets_vs_static", "working_sets_vs_serial"] {
        assert!(report["ratios"][key].as_f64().unwrap() > 0.0, "{key}: {report}");
    }
    // Each throughput set ran twice, and so did the hog's victims (alone and beside it) and the
    // job under the daemon and standalone: each figure is the median (here the mean) of its two
    // runs, every run in the report.
    let modes = ["static", "tiermemd", "serial", "working_sets"].map(|m| format!("throughput_{m}_GBps"));
    for key in modes.iter().map(String::as_str).chain(["hog_victim_speed", "overhead_alone"]) {
        let runs: Vec<f64> = report["metrics"][format!("{key}_runs")]
            .as_array()
            .unwrap_or_else(|| panic!("{key}'s runs: {report}"))
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(runs.len(), 2, "{key}: {runs:?}");
        assert!(runs.iter().all(|&r| r > 0.0), "{key}: {runs:?}");
        let median = report["metrics"][key].as_f64().unwrap();
        assert!((median - (runs[0] + runs[1]) / 2.0).abs() < 1e-9, "{key}: {median} of {runs:?}");
    }
    // Each round's end in the detail: as many values as the columns named, running totals that
    // never fall, and a budget within the cap.
    let detail = json_ending(&dir.0, "-test.detail.json");
    let columns: Vec<&str> = detail["rounds_columns"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    let column =
        |name: &str| columns.iter().position(|&c| c == name).unwrap_or_else(|| panic!("{name} in {columns:?}"));
    let jobs = |mode: &str| detail[mode].as_array().unwrap().clone();
    for mode in ["static", "tiermemd"] {
        let repeats: Vec<u64> = jobs(mode).iter().map(|j| j["repeat"].as_u64().unwrap()).collect();
        assert_eq!(repeats, [0, 0, 0, 1, 1, 1], "{mode}: three jobs a repeat, each marked");
    }
    for job in jobs("static").iter().chain(&jobs("tiermemd")) {
        let rounds = job["rounds"].as_array().unwrap();
        assert!(!rounds.is_empty(), "{job}");
        for pair in rounds.windows(2) {
            for name in ["s", "paged_in", "stall_ms", "evict_wait_ms", "map_ms", "pin_ms"] {
                let at = |r: &serde_json::Value| r[column(name)].as_f64().unwrap();
                assert!(at(&pair[1]) >= at(&pair[0]), "{name} fell: {pair:?}");
            }
        }
        for round in rounds {
            assert_eq!(round.as_array().unwrap().len(), columns.len(), "{round}");
            assert!(round[column("hbm_budget")].as_u64().unwrap() <= 64 << 20, "{round}");
        }
    }
}

/// The JSON file in `dir` whose name ends with `suffix`, read.
fn json_ending(dir: &std::path::Path, suffix: &str) -> serde_json::Value {
    let path = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with(suffix))
        .unwrap_or_else(|| panic!("no file ending in {suffix} in {}", dir.display()));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}
