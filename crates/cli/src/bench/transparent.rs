//! `tiermem bench transparent` (issue 16): an unmodified PyTorch training loop
//! (bench/transparent_train.py) timed (a) plainly, with no cap; (b) under `tiermem run` with a
//! budget above its peak (the interposition's overhead); (c) under budgets of 0.7× and 0.5×
//! that peak; and (d) plainly with the stock caching allocator capped at 0.7× of the peak,
//! which should run out of memory. Each run is a process of its own; the peak is what the
//! allocator reserved in (a). The losses of every run that finished must be bitwise those of (a).
//!
//! Each interposed run writes tiermem's counters at exit (`TIERMEM_STATS_JSON`): what migration
//! moved and the time it spent at quiesce points (`quiesce_ms_per_step` divides it by the steps
//! run), and the share of launches with tiermem's pointers whose pointers were all in HBM
//! (`launches_all_in_hbm_share`, from the run at 0.7× the peak). Both are in each run's report
//! under `tiermem`. Stage 3's counters (pauses, their time, cycles followed and diverged) are
//! in `segments_0_7`/`segments_0_5`, and `pause_ms_per_step` divides the time in pauses by the steps.
//!
//! Beside them, (e) the same loop with PyTorch's stream-ordered backend
//! (`PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync`: a tensor is an allocation, freed in stream
//! order) at 0.7× the peak, for at least 12 steps: its steady step (`step_s_async_budget_0_7`,
//! the median of its last quarter: the two cycles of its step are told apart and its kept frees
//! planned only from the fifth step, docs/transparent.md) and `speed_async_0_7`, informative
//! (the targets are for the caching allocator's runs).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

pub struct Setup {
    /// The training script.
    pub script: PathBuf,
    pub steps: usize,
    /// A small model (a smoke test of the suite, not a measurement).
    pub small: bool,
    /// The coverage matrix's programs (`None`: all; `Some("none")`: none).
    pub matrix: Option<String>,
}

/// The coverage matrix (bench/transparent_matrix.py beside the training script): its report,
/// or why it gave none.
fn matrix(setup: &Setup) -> Value {
    if setup.matrix.as_deref() == Some("none") {
        return json!({ "not_run": "--matrix none" });
    }
    let script = setup.script.with_file_name("transparent_matrix.py");
    let out = std::env::temp_dir().join(format!("tiermem-transparent-{}-matrix.json", std::process::id()));
    let tiermem = match std::env::current_exe() {
        Ok(path) => path,
        Err(e) => return json!({ "failed": format!("bench transparent: the tiermem program's path: {e}") }),
    };
    println!("bench transparent: the coverage matrix ({})", script.display());
    let mut command = Command::new("python3");
    command.arg(&script).arg("--tiermem").arg(&tiermem).arg("--out").arg(&out);
    if let Some(programs) = &setup.matrix {
        command.args(["--programs", programs]);
    }
    let status = command.status();
    let report = std::fs::read_to_string(&out).ok().and_then(|t| serde_json::from_str::<Value>(&t).ok());
    let _ = std::fs::remove_file(&out);
    match (status, report) {
        (Ok(status), Some(report)) if status.success() => report,
        (status, _) => {
            json!({ "failed": format!("bench transparent: {} gave no report ({status:?})", script.display()) })
        }
    }
}

/// Steps of the stream-ordered backend's run at least (its warm-up takes four).
const ASYNC_STEPS: usize = 12;

/// PyTorch's allocator in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Allocator {
    /// Its caching allocator (the default): segments of many tensors.
    Caching,
    /// Its `cudaMallocAsync` backend: each tensor a stream-ordered allocation.
    StreamOrdered,
    /// tiermem's `CUDAPluggableAllocator` (`tiermem run --torch-allocator`): each tensor an
    /// allocation of tiermem's, ordered on its stream.
    Tiermem,
}

/// One run of the script: its report, or why it gave none. With an allocator that makes each
/// tensor an allocation, at least [`ASYNC_STEPS`] steps.
fn train(
    setup: &Setup,
    label: &str,
    budget: Option<usize>,
    memory_fraction: Option<f64>,
    allocator: Allocator,
) -> Result<Value, String> {
    let out = std::env::temp_dir().join(format!("tiermem-transparent-{}-{label}.json", std::process::id()));
    let counters = out.with_extension("tiermem.json");
    let mut command = Command::new("python3");
    let steps = if allocator == Allocator::Caching { setup.steps } else { setup.steps.max(ASYNC_STEPS) };
    command.arg(&setup.script).arg("--out").arg(&out).args(["--steps", &steps.to_string()]);
    if allocator == Allocator::StreamOrdered {
        command.env("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync");
    }
    command.args(setup.small.then_some("--small"));
    if let Some(fraction) = memory_fraction {
        command.args(["--memory-fraction", &format!("{fraction:.4}")]);
    }
    if let Some(bytes) = budget {
        let library = crate::run::interpose_library(&mut command, Some(tiermem::HbmLimit::Bytes(bytes)))?;
        if allocator == Allocator::Tiermem {
            crate::run::install_torch_hook(&mut command, &library)?;
        }
        command.env("TIERMEM_STATS", "1").env("TIERMEM_STATS_JSON", &counters);
    }
    println!("bench transparent: {label}{}", budget.map_or(String::new(), |b| format!(", budget {b} bytes")));
    let status = command.status().map_err(|e| format!("bench transparent: python3 {}: {e}", setup.script.display()))?;
    let read = |path: &Path| std::fs::read_to_string(path).ok().and_then(|t| serde_json::from_str::<Value>(&t).ok());
    let (report, tiermem) = (read(&out), read(&counters));
    let _ = (std::fs::remove_file(&out), std::fs::remove_file(&counters));
    match report {
        Some(mut report) if status.success() => {
            report["tiermem"] = tiermem.unwrap_or(Value::Null);
            Ok(report)
        }
        _ => Err(format!("bench transparent: the {label} run failed ({status}) and wrote no report")),
    }
}

/// As [`train`], a failure recorded in the report (`failed`) instead of ending the suite.
fn train_or_record(
    setup: &Setup,
    label: &str,
    budget: Option<usize>,
    fraction: Option<f64>,
    allocator: Allocator,
) -> Value {
    train(setup, label, budget, fraction, allocator).unwrap_or_else(|e| {
        eprintln!("{e}");
        json!({ "failed": e, "oom": null, "losses": null })
    })
}

/// Per program of the matrix, seconds per run: plain, and at each budget.
fn matrix_seconds(coverage: &Value) -> Value {
    let Some(programs) = coverage["programs"].as_object() else { return Value::Null };
    let per_run = |runs: &Value| {
        let runs = runs.as_object().map(|r| r.iter().map(|(k, v)| (k.clone(), v["seconds"].clone())).collect());
        Value::Object(runs.unwrap_or_default())
    };
    Value::Object(programs.iter().map(|(name, runs)| (name.clone(), per_run(runs))).collect())
}

fn step_s(report: &Value) -> Option<f64> {
    report["step_s_median"].as_f64()
}

/// The median of the last quarter of a run's steps (at least one): its steady step.
fn steady_step_s(report: &Value) -> Option<f64> {
    let steps: Vec<f64> = report["step_s"].as_array()?.iter().filter_map(Value::as_f64).collect();
    let mut last = steps[steps.len() - (steps.len() / 4).max(1).min(steps.len())..].to_vec();
    last.sort_by(f64::total_cmp);
    last.get(last.len() / 2).copied()
}

pub fn run(dir: &Path, commit: &str, setup: Setup) -> Result<(), String> {
    let uncapped = train(&setup, "uncapped", None, None, Allocator::Caching)?;
    let peak =
        uncapped["max_memory_reserved"].as_u64().filter(|&p| p > 0).ok_or("bench transparent: no peak reported")?;
    let total = uncapped["mem_get_info_total"].as_f64().ok_or("bench transparent: no GPU memory reported")?;
    let budget = |share: f64| (peak as f64 * share) as usize;
    let caching = Allocator::Caching;
    let fits = train_or_record(&setup, "fits", Some(budget(2.0)), None, caching);
    let at_0_7 = train_or_record(&setup, "budget 0.7", Some(budget(0.7)), None, caching);
    let at_0_5 = train_or_record(&setup, "budget 0.5", Some(budget(0.5)), None, caching);
    let stock =
        train_or_record(&setup, "stock allocator capped at 0.7", None, Some(0.7 * peak as f64 / total), caching);
    let ordered_0_7 = train_or_record(
        &setup,
        "cudaMallocAsync backend, budget 0.7",
        Some(budget(0.7)),
        None,
        Allocator::StreamOrdered,
    );
    let pluggable_0_7 = train_or_record(
        &setup,
        "tiermem's pluggable allocator, budget 0.7",
        Some(budget(0.7)),
        None,
        Allocator::Tiermem,
    );

    let same = |run: &Value| run["oom"] == false && run["losses"] == uncapped["losses"];
    // A longer run's first losses are the plain run's.
    let starts_with_plain = |run: &Value| {
        run["oom"] == false
            && run["losses"].as_array().zip(uncapped["losses"].as_array()).is_some_and(|(a, u)| a.starts_with(u))
    };
    let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
    let (s_uncapped, s_fits, s_07, s_05) = (step_s(&uncapped), step_s(&fits), step_s(&at_0_7), step_s(&at_0_5));
    // Time at quiesce points over the steps run (the first, which warms up, included).
    let per_step = |run: &Value, group: &str, key: &str| {
        let steps = run["step_s"].as_array().map_or(0, Vec::len);
        run["tiermem"][group][key].as_f64().filter(|_| steps > 0).map(|ms| ms / steps as f64)
    };
    let quiesce_ms_per_step = |run: &Value| per_step(run, "migration", "quiesce_ms");
    let coverage = matrix(&setup);
    let mut checks = json!({
        "losses_identical": same(&fits) && same(&at_0_7) && same(&at_0_5),
        "uncapped_finished": uncapped["oom"] == false,
        "pytorch_training_fits": same(&fits),
        "pytorch_training_budget_0_7": same(&at_0_7),
        "pytorch_training_budget_0_5": same(&at_0_5),
        "pytorch_async_backend_budget_0_7": starts_with_plain(&ordered_0_7),
        "pytorch_torch_allocator_budget_0_7": starts_with_plain(&pluggable_0_7),
    });
    if let (Some(all), Some(matrix)) = (checks.as_object_mut(), coverage["checks"].as_object()) {
        all.extend(matrix.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    if coverage.get("failed").is_some() {
        checks["matrix_ran"] = json!(false);
    }
    let verified = checks.as_object().is_some_and(|c| c.values().all(|v| v == true));
    let metrics = json!({
        "step_s_uncapped": s_uncapped,
        "step_s_interposed_fits": s_fits,
        "step_s_budget_0_7": s_07,
        "step_s_budget_0_5": s_05,
        "step_s_async_budget_0_7": steady_step_s(&ordered_0_7),
        "step_s_async_budget_0_7_all": ordered_0_7["step_s"],
        "step_s_torch_allocator_budget_0_7": steady_step_s(&pluggable_0_7),
        "step_s_torch_allocator_budget_0_7_all": pluggable_0_7["step_s"],
        "stock_oom_at_0_7": stock["oom"] == true,
        "stock_error": stock["error"],
        "quiesce_ms_per_step": quiesce_ms_per_step(&at_0_7),
        "quiesce_ms_per_step_0_5": quiesce_ms_per_step(&at_0_5),
        "launches_all_in_hbm_share": at_0_7["tiermem"]["launches"]["all_in_hbm_share"],
        "launches_all_in_hbm_share_0_5": at_0_5["tiermem"]["launches"]["all_in_hbm_share"],
        "migration_0_7": at_0_7["tiermem"]["migration"],
        "migration_0_5": at_0_5["tiermem"]["migration"],
        "pause_ms_per_step": per_step(&at_0_7, "segments", "pause_ms"),
        "pause_ms_per_step_0_5": per_step(&at_0_5, "segments", "pause_ms"),
        "segments_0_7": at_0_7["tiermem"]["segments"],
        "segments_0_5": at_0_5["tiermem"]["segments"],
        "peak_reserved_bytes": peak,
        "neighbours_peak_bytes": { "0_7": at_0_7["tiermem"]["neighbours_peak_bytes"], "0_5": at_0_5["tiermem"]["neighbours_peak_bytes"] },
        "budgets_bytes": { "fits": budget(2.0), "0_7": budget(0.7), "0_5": budget(0.5) },
        "small": setup.small,
        "matrix_skipped": coverage["skipped"],
        "matrix_seconds": matrix_seconds(&coverage),
    });
    let ratios = json!({
        "overhead": ratio(s_fits, s_uncapped),
        "speed_0_7": ratio(s_uncapped, s_07),
        "speed_0_5": ratio(s_uncapped, s_05),
        "speed_async_0_7": ratio(s_uncapped, steady_step_s(&ordered_0_7)),
        "speed_torch_allocator_0_7": ratio(s_uncapped, steady_step_s(&pluggable_0_7)),
    });
    let date = super::today();
    // Neighbours' HBM beyond the budget (TIERMEM_PEERS, inherited by every `tiermem run`): a
    // measurement of its own, named apart from the host-only one.
    let peers = std::env::var("TIERMEM_PEERS").ok().filter(|p| !p.trim().is_empty() && p.trim() != "off");
    let suite = if peers.is_some() { "transparent-peers" } else { "transparent" };
    let report = json!({
        "suite": suite, "commit": commit, "date": date, "peers": peers,
        "device": { "name": uncapped["device"], "torch": uncapped["torch"] },
        "metrics": metrics, "ratios": ratios, "checks": checks, "verified": verified,
        "notes": "stage 2: chunks placed at allocation (HBM up to the budget, host-located VMM chunks beyond), \
                  moved at quiesce points (the program's synchronizations) by hotness from launch arguments; \
                  stage 3 (on unless TIERMEM_SEGMENTS=off): each step's launches recorded and paged in by \
                  segments at pauses (pause_ms_per_step, segments_*); \
                  quiesce_ms_per_step and launches_all_in_hbm_share from the run at 0.7x the peak",
    });
    let detail = json!({
        "uncapped": uncapped, "fits": fits, "budget_0_7": at_0_7, "budget_0_5": at_0_5, "stock_0_7": stock,
        "async_budget_0_7": ordered_0_7,
        "torch_allocator_budget_0_7": pluggable_0_7,
        "matrix": coverage,
    });
    println!(
        "{}",
        serde_json::to_string_pretty(&json!({ "ratios": report["ratios"], "checks": report["checks"] }))
            .unwrap_or_default()
    );
    super::write_report(dir, suite, &date, commit, &report, &detail)
}
