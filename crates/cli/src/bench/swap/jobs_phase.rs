//! The swap-bound jobs of `bench swap`: with each swap alone in turn (the disk's, zram, the
//! VRAM device's), one job (`swap_job.rs`) and then several at once, each a process in a cgroup
//! whose `memory.max` is half its working set; the slowest one's time to completion, each job's
//! check of its own words, OOM kills and swap traffic; a hung-task watch throughout.

use super::report::Record;
use super::{Bench, Kind, PREFIX};
use crate::bench::swap_sys::{self as sys, HungWatch};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The metric of `n` jobs at once with `kind` as swap: `job_s_KIND`, `jobN_s_KIND`.
pub(super) fn job_metric(kind: Kind, n: usize) -> String {
    match n {
        1 => format!("job_s_{}", kind.name()),
        n => format!("job{n}_s_{}", kind.name()),
    }
}

/// The check of `n` jobs at once with `kind` as swap (every word of each job as it should be).
fn job_check(kind: Kind, n: usize) -> String {
    format!("jobs_{}x{n}", kind.name())
}

/// The jobs with each swap in turn, in cgroups of the benchmark's own.
pub(super) fn jobs_all(bench: &Bench, record: &mut Record) {
    // VRAM first: the parts past the time budget are skipped, and its jobs are the point; zram
    // (one job, the quickest) before the disk, whose three jobs at once take longest (~2 min).
    let plan = [(Kind::Vram, &[1usize, 3][..]), (Kind::Zram, &[1][..]), (Kind::Disk, &[1, 3][..])];
    let cgroups = match sys::Cgroups::create() {
        Ok(c) => c,
        Err(e) => {
            let why = format!("no cgroup for the jobs: {e}");
            for (kind, counts) in plan {
                jobs_not_run(record, kind, counts, &why);
            }
            return;
        }
    };
    record.note(&["jobs", "cgroup"], json!(cgroups.path.display().to_string()));
    for (kind, counts) in plan {
        if bench.may_begin(record, &format!("jobs_{}", kind.name())) {
            jobs_with(bench, record, kind, counts, &cgroups);
        } else {
            for &n in counts {
                record.check(job_check(kind, n), None);
            }
        }
        record.save(bench, true);
    }
}

/// Records `counts`' numbers of jobs with `kind` as not run, and why.
fn jobs_not_run(record: &mut Record, kind: Kind, counts: &[usize], why: &str) {
    for &n in counts {
        record.fail(&job_metric(kind, n), why.to_string());
        record.check(job_check(kind, n), None);
    }
}

/// The jobs with `kind` as the only swap: one alone, then `counts`' other numbers at once.
fn jobs_with(bench: &Bench, record: &mut Record, kind: Kind, counts: &[usize], cgroups: &sys::Cgroups) {
    let target = match super::targets::swap_target(bench, record, kind) {
        Ok(t) => t,
        Err(e) => return jobs_not_run(record, kind, counts, &format!("setting up {} swap: {e}", kind.name())),
    };
    let active = sys::active_swaps();
    if active.is_empty() {
        let why = format!("no swap area active after setting up {} swap", kind.name());
        return jobs_not_run(record, kind, counts, &why);
    }
    eprintln!(
        "bench swap: jobs with {} swap (active: {})",
        kind.name(),
        active.iter().map(|a| format!("{} prio {}", a.filename, a.priority)).collect::<Vec<_>>().join(", ")
    );
    record.note(&["jobs", kind.name(), "swaps_active"], json!(active.iter().map(|a| &a.filename).collect::<Vec<_>>()));
    let watch = HungWatch::start();
    for &n in counts {
        if sys::interrupted() {
            record.check(job_check(kind, n), None);
            continue;
        }
        let key = job_metric(kind, n);
        match job_set(bench, kind, n, cgroups) {
            Ok((seconds, detail, ok)) => {
                eprintln!("bench swap:   {n} job(s): {seconds:.1} s, every word checked: {ok}");
                record.note(&["jobs", kind.name(), &format!("x{n}")], detail.clone());
                record.check(job_check(kind, n), Some(ok));
                if ok {
                    record.set(&key, seconds);
                } else {
                    record.fail(&key, format!("a job failed or a word differed: {detail}"));
                }
            }
            Err(e) => {
                record.fail(&key, e);
                record.check(job_check(kind, n), None);
            }
        }
    }
    let report = watch.finish();
    if kind == Kind::Vram {
        record.add_hung(report, "jobs_vram");
        if let Some(v) = &target.vram {
            record.note(&["vram_status", "after_jobs"], v.status());
        }
    } else {
        eprintln!(
            "bench swap:   ({} swap: {} tasks hung, longest D {:.1} s)",
            kind.name(),
            report.hung_tasks,
            report.longest_d_s
        );
        record.note(&["hung", &format!("jobs_{}", kind.name())], json!(report));
    }
}

/// `n` jobs at once, each in its own cgroup: (the slowest one's seconds, detail, all checked out).
fn job_set(bench: &Bench, kind: Kind, n: usize, cgroups: &sys::Cgroups) -> Result<(f64, Value, bool), String> {
    let size = bench.setup.size;
    let before = sys::vmstat();
    let limit = bench.limit(Duration::from_secs_f64(if bench.setup.quick { 120.0 } else { 300.0 }));
    let mut running: Vec<(Child, PathBuf, PathBuf)> = Vec::new();
    let started = Instant::now();
    let spawned = (0..n).try_for_each(|k| {
        let cgroup = cgroups.child(&format!("{}-x{n}-{k}", kind.name()), size / 2)?;
        let out = std::env::temp_dir().join(format!("{PREFIX}job-{}-{k}.json", std::process::id()));
        let file = std::fs::File::create(&out).map_err(|e| format!("create {}: {e}", out.display()))?;
        let child = Command::new(&bench.exe)
            .args(["bench", "swap-job", "--size", &size.to_string(), "--passes", &bench.setup.passes.to_string()])
            .args(["--seed", &(k + 1).to_string()])
            .arg("--cgroup")
            .arg(&cgroup)
            .stdin(Stdio::null())
            .stdout(file)
            .spawn()
            .map_err(|e| format!("start a swap-job: {e}"))?;
        running.push((child, cgroup, out));
        Ok::<(), String>(())
    });
    // Wait for all, killing them all past the limit or on a signal.
    let mut statuses = vec![None; running.len()];
    let mut stopped = spawned.err();
    while statuses.iter().any(Option::is_none) {
        for (k, (child, _, _)) in running.iter_mut().enumerate() {
            if statuses[k].is_none() {
                if let Ok(Some(status)) = child.try_wait() {
                    statuses[k] = Some(status.success());
                }
            }
        }
        if stopped.is_none() && (started.elapsed() > limit || sys::interrupted()) {
            stopped = Some(if sys::interrupted() {
                "interrupted".to_string()
            } else {
                format!("timed out after {:.0} s", limit.as_secs_f64())
            });
        }
        if stopped.is_some() {
            for (k, (child, cgroup, _)) in running.iter_mut().enumerate() {
                if statuses[k].is_none() {
                    let _ = sys::remove_cgroup(cgroup);
                    let _ = child.kill();
                    statuses[k] = Some(child.wait().is_ok_and(|s| s.success()));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let wall = started.elapsed().as_secs_f64();
    let after = sys::vmstat();
    let delta = |k: &str| after.get(k).unwrap_or(&0).saturating_sub(*before.get(k).unwrap_or(&0)) * 4096;
    let mut jobs = Vec::new();
    let mut all_ok = stopped.is_none();
    let mut slowest: f64 = 0.0;
    for ((_, cgroup, out), status) in running.iter().zip(&statuses) {
        let text = std::fs::read_to_string(out).unwrap_or_default();
        let _ = std::fs::remove_file(out);
        let line = text.lines().rev().find_map(|l| serde_json::from_str::<Value>(l).ok()).unwrap_or(Value::Null);
        let ok = *status == Some(true) && line["ok"] == json!(true);
        all_ok &= ok;
        slowest = slowest.max(line["seconds"].as_f64().unwrap_or(f64::NAN));
        jobs.push(json!({
            "exit_ok": status, "result": line,
            "oom_kills": sys::memory_event(cgroup, "oom_kill"),
            "memory_max_events": sys::memory_event(cgroup, "max"),
        }));
        let _ = sys::remove_cgroup(cgroup);
    }
    let detail = json!({
        "jobs": jobs, "wall_s": wall, "stopped": stopped,
        "working_set_bytes": size, "memory_max_bytes": size / 2, "passes": bench.setup.passes,
        "swapped_in_bytes": delta("pswpin"), "swapped_out_bytes": delta("pswpout"),
    });
    match stopped {
        Some(why) => Err(format!("{why}: {detail}")),
        None => Ok((slowest, detail, all_ok)),
    }
}
