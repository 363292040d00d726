//! `tiermem bench transparent`'s harness, over a stand-in for the training script (CI has no
//! GPU and no PyTorch): which runs are preloaded and with which budget, how the peak turns into
//! budgets, and how the report's ratios and checks come out of the runs' own reports.

mod support;

use std::path::{Path, PathBuf};

/// A stand-in for bench/transparent_train.py: reports a peak of 1000 bytes reserved on a GPU of
/// 10,000; under tiermem (LD_PRELOAD set) a step takes 0.12 s with a budget of at least the
/// peak, 0.2 s below it, else 0.1 s; with --memory-fraction it runs out of memory; with
/// PyTorch's `cudaMallocAsync` backend its steps take 1 s but the last three 0.25 s. With
/// FAKE_DIFFER set, the run at half the peak reports other losses.
const FAKE: &str = r#"
import json, os, sys
args = sys.argv[1:]
out = args[args.index("--out") + 1]
budget = int(os.environ.get("TIERMEM_HBM_LIMIT", "0")) if "tiermem_preload" in os.environ.get("LD_PRELOAD", "") else None
r = {"mem_get_info_total": 10000, "max_memory_reserved": 1000, "oom": False, "losses": [3.0, 2.5],
     "device": "fake GPU", "torch": "none", "budget_seen": budget}
if "--memory-fraction" in args:
    r.update(oom=True, losses=[3.0], error="CUDA out of memory", fraction=float(args[args.index("--memory-fraction") + 1]))
r["step_s_median"] = 0.1 if budget is None else (0.12 if budget >= 1000 else 0.2)
r["alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
r["steps"] = int(args[args.index("--steps") + 1])
if r["alloc_conf"] == "backend:cudaMallocAsync":
    r["step_s"] = [1.0] * (r["steps"] - 3) + [0.25] * 3
if budget == 500 and os.environ.get("FAKE_DIFFER"):
    r["losses"] = [3.0, 2.4]
json.dump(r, open(out, "w"))
"#;

/// A stand-in for bench/transparent_matrix.py (found beside the training script): checks that it
/// was given the tiermem program, then reports one program that passed and one skipped.
const FAKE_MATRIX: &str = r#"
import json, os, sys
args = sys.argv[1:]
tiermem = args[args.index("--tiermem") + 1]
assert os.access(tiermem, os.X_OK), tiermem
report = {"programs": {"p": {"plain": {"seconds": 1.5}, "fits": {"seconds": 1.6}}},
          "checks": {"matrix_p_fits": True}, "skipped": {"q": "q is not installed"}}
json.dump(report, open(args[args.index("--out") + 1], "w"))
"#;

fn preload_library() -> PathBuf {
    std::env::current_exe().unwrap().parent().unwrap().join("libtiermem_preload.so")
}

fn bench(dir: &Path, differ: bool) -> serde_json::Value {
    bench_with(dir, differ, FAKE_MATRIX)
}

/// As [`bench`], with `matrix` as the coverage matrix's script.
fn bench_with(dir: &Path, differ: bool, matrix: &str) -> serde_json::Value {
    let script = dir.join("fake_train.py");
    std::fs::write(&script, FAKE).unwrap();
    std::fs::write(dir.join("transparent_matrix.py"), matrix).unwrap();
    let mut command = support::tiermem();
    command.args(["bench", "transparent", "--commit", "abcdef0123", "--steps", "3", "--script"]).arg(&script);
    command.arg("--json").arg(dir).env("TIERMEM_PRELOAD", preload_library()).env_remove("LD_PRELOAD");
    if differ {
        command.env("FAKE_DIFFER", "1");
    }
    let output = command.output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{text}");
    let name = format!("transparent-{}-abcdef0.json", tiermem_cli_today());
    serde_json::from_str(&std::fs::read_to_string(dir.join(name)).unwrap()).unwrap()
}

/// The report's date, as the suite writes it (UTC).
fn tiermem_cli_today() -> String {
    let out = std::process::Command::new("date").args(["-u", "+%Y%m%d"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn the_runs_budgets_ratios_and_checks() {
    if !preload_library().is_file() || std::process::Command::new("python3").arg("-V").output().is_err() {
        eprintln!("skipped: needs python3 and the preload library beside the test");
        return;
    }
    let dir = support::TempDir::new("bench-transparent");
    let report = bench(&dir.0, false);
    let (metrics, ratios, checks) = (&report["metrics"], &report["ratios"], &report["checks"]);
    assert_eq!(report["suite"], "transparent");
    assert_eq!(metrics["peak_reserved_bytes"], 1000);
    assert_eq!(metrics["budgets_bytes"], serde_json::json!({ "fits": 2000, "0_7": 700, "0_5": 500 }));
    assert_eq!(metrics["stock_oom_at_0_7"], true);
    let close = |v: &serde_json::Value, want: f64| (v.as_f64().unwrap() - want).abs() < 1e-9;
    assert!(close(&ratios["overhead"], 1.2), "{ratios}");
    assert!(close(&ratios["speed_0_7"], 0.5) && close(&ratios["speed_0_5"], 0.5), "{ratios}");
    assert_eq!(checks["losses_identical"], true, "{checks}");
    // The coverage matrix's checks join the report's; what it skipped and its times are there.
    assert_eq!(checks["matrix_p_fits"], true, "{checks}");
    assert_eq!(metrics["matrix_skipped"]["q"], "q is not installed");
    assert_eq!(metrics["matrix_seconds"]["p"]["fits"], 1.6);
    assert_eq!(report["verified"], true);
    // The stock run was capped at 0.7 of the peak, as a fraction of the GPU, and not preloaded.
    let detail_name = format!("transparent-{}-abcdef0.detail.json", tiermem_cli_today());
    let detail: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.0.join(detail_name)).unwrap()).unwrap();
    assert_eq!(detail["stock_0_7"]["fraction"], 0.07);
    assert_eq!(detail["stock_0_7"]["budget_seen"], serde_json::Value::Null);
    assert_eq!(detail["uncapped"]["budget_seen"], serde_json::Value::Null);
    assert_eq!(detail["budget_0_5"]["budget_seen"], 500);
    // The stream-ordered backend at 0.7x, for 12 steps at least; its steady step is the last
    // quarter's, and its losses begin with the plain run's.
    assert_eq!(detail["async_budget_0_7"]["alloc_conf"], "backend:cudaMallocAsync");
    assert_eq!(
        (&detail["async_budget_0_7"]["steps"], &detail["async_budget_0_7"]["budget_seen"]),
        (&12.into(), &700.into())
    );
    assert_eq!(detail["budget_0_7"]["alloc_conf"], serde_json::Value::Null, "the others with PyTorch's own allocator");
    assert!(close(&metrics["step_s_async_budget_0_7"], 0.25) && close(&ratios["speed_async_0_7"], 0.4), "{metrics}");
    assert_eq!(checks["pytorch_async_backend_budget_0_7"], true, "{checks}");

    let report = bench(&dir.0, true);
    assert_eq!(report["checks"]["losses_identical"], false);
    assert_eq!(report["checks"]["pytorch_training_budget_0_5"], false);
    assert_eq!(report["verified"], false);

    // A matrix that gives no report is a failed check, not a silent pass.
    let report = bench_with(&dir.0, false, "import sys; sys.exit(3)");
    assert_eq!(report["checks"]["matrix_ran"], false, "{}", report["checks"]);
    assert_eq!(report["verified"], false);
}
