//! `tiermem bench swap --json DIR`: CPU programs borrowing idle VRAM as swap (issue 14,
//! GAME), against swap on the local disk and zram, all in one run, as root, on the GPU
//! machine only (it enables swap, attaches loop devices, loads zram; never run it on a shared
//! machine).
//!
//! * **fio** on each device — the VRAM device (`tiermem swap on --no-enable`), a loop device
//!   (direct I/O) over a file on the local disk, zram: 1 MiB sequential write (which also fills
//!   the region) and read, 4 KiB random read and write at queue depth 1 and 32, 32 KiB random
//!   read at depth 1 (swap-in's request: `page-cluster` 3), then `verify=crc32c` passes that
//!   write and check every block (sequential 1 MiB, random 4 KiB at depth 32).
//! * **Give-back**: the VRAM device still full of fio's blocks, its HBM cap is forced to 0
//!   (`tiermem swap cap 0 --json`): bytes moved ÷ seconds; then the random verify pass's blocks are
//!   checked again, now from the spill file.
//! * **The swap-bound job** (`swap_job.rs`) with each swap alone in turn (VRAM, a swap file on
//!   the disk, zram), in a cgroup whose `memory.max` is half its working set; three at once
//!   with VRAM and with disk swap (GAME's multitasking case). Time to completion; every word
//!   checked.
//! * A watch of every task's state during the VRAM runs: `hung_tasks` counts tasks that stayed
//!   in uninterruptible sleep for 10 s (with their kernel stacks in the detail).
//!
//! It refuses to start without `TIERMEM_ALLOW_SWAP=1` in its environment.
//!
//! A sub-measurement that fails is `null` in `metrics` with its reason in `failures`; the run
//! goes on. Everything set up is undone by guards (`swap_sys.rs`), also on errors and signals;
//! scripts/gpu/run.sh also cleans up after it. The report is rewritten after each part (with
//! `"partial": true`) so that a run cut short still leaves its numbers.

use super::swap_fio::{self, IoEngine, Job, Verify};
use super::swap_sys::{self as sys, HungReport, HungWatch, PREFIX};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// nbd-vram's published sequential read, GB/s (the issue's baseline).
const NBD_VRAM_SEQ_READ_GBPS: f64 = 2.7;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

pub struct Setup {
    /// A folder on the local disk for the disk target, the swap file and the spill file.
    pub dir: PathBuf,
    /// The swap-bound job's working set (its cgroup gets half).
    pub size: u64,
    /// The job's steps, in passes over its array.
    pub passes: f64,
    /// Small sizes and short runs: a smoke test of the whole benchmark.
    pub quick: bool,
    /// fio's binary (default: fio on PATH).
    pub fio: Option<PathBuf>,
    /// Added to every `tiermem swap on`.
    pub swap_args: Vec<String>,
    /// Seconds after which the parts not yet begun are skipped; 90 s later, the part under way
    /// is stopped.
    pub budget_s: f64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Vram,
    Disk,
    Zram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Vram => "vram",
            Kind::Disk => "disk",
            Kind::Zram => "zram",
        }
    }

    /// The prefix of its fio metrics (the VRAM device's have none).
    fn prefix(self) -> &'static str {
        match self {
            Kind::Vram => "",
            Kind::Disk => "disk_",
            Kind::Zram => "zram_",
        }
    }
}

/// The fio metrics of one device, without prefix: the issue's, then the extra ones.
const FIO_METRICS: [&str; 16] = [
    "seq_read_GBps",
    "seq_write_GBps",
    "rand4k_read_iops_qd32",
    "rand4k_write_iops_qd32",
    "rand4k_read_lat_us_qd1",
    "rand32k_read_lat_us_qd1",
    "rand4k_read_iops_qd1",
    "rand4k_write_iops_qd1",
    "rand4k_write_lat_us_qd1",
    "rand4k_read_lat_us_qd1_p50",
    "rand4k_read_lat_us_qd1_p99",
    "rand32k_read_lat_us_qd1_p50",
    "rand32k_read_lat_us_qd1_p99",
    "rand32k_read_iops_qd1",
    "seq_write_verify_GBps",
    "rand4k_write_verify_iops_qd32",
];

/// Every key of `metrics`, each `null` until measured.
fn metric_keys() -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for kind in [Kind::Vram, Kind::Disk, Kind::Zram] {
        keys.extend(FIO_METRICS.iter().map(|m| format!("{}{m}", kind.prefix())));
    }
    keys.push("giveback_GBps".into());
    keys.push("giveback_s".into());
    for k in ["job_s_vram", "job_s_disk", "job_s_zram", "job3_s_vram", "job3_s_disk"] {
        keys.push(k.into());
    }
    keys.extend(["fio_verify_errors", "hung_tasks", "longest_d_state_s"].map(String::from));
    keys
}

/// `a ÷ b` where both were measured.
fn ratio(metrics: &Map<String, Value>, a: &str, b: &str) -> Value {
    match (metrics.get(a).and_then(Value::as_f64), metrics.get(b).and_then(Value::as_f64)) {
        (Some(x), Some(y)) if y > 0.0 => json!(x / y),
        _ => Value::Null,
    }
}

/// The ratios the issue asks for, from the metrics.
fn ratios(metrics: &Map<String, Value>) -> Value {
    let seq = metrics.get("seq_read_GBps").and_then(Value::as_f64);
    json!({
        "job_vs_disk": ratio(metrics, "job_s_disk", "job_s_vram"),
        "job_vs_zram": ratio(metrics, "job_s_zram", "job_s_vram"),
        "job3_vs_disk": ratio(metrics, "job3_s_disk", "job3_s_vram"),
        "seq_read_vs_nbd_vram": seq.map_or(Value::Null, |s| json!(s / NBD_VRAM_SEQ_READ_GBPS)),
        "seq_read_vs_disk": ratio(metrics, "seq_read_GBps", "disk_seq_read_GBps"),
        "rand32k_lat_vs_disk": ratio(metrics, "rand32k_read_lat_us_qd1", "disk_rand32k_read_lat_us_qd1"),
    })
}

/// The targets of issue 14 (recorded in the detail, as the other suites do).
fn targets() -> Value {
    json!({
        "job_vs_disk": ">= 2",
        "rand32k_read_lat_us_qd1": "<= 50",
        "seq_read_vs_nbd_vram": ">= 3",
        "fio_verify_errors": "= 0",
        "hung_tasks": "= 0",
    })
}

struct Bench {
    setup: Setup,
    commit: String,
    date: String,
    json_dir: PathBuf,
    info: tiermem::mechanism::DeviceInfo,
    exe: PathBuf,
    started: Instant,
    metrics: Map<String, Value>,
    failures: Map<String, Value>,
    detail: Map<String, Value>,
    /// Each verification planned: passed, failed, or never ran (`None`).
    checks: Vec<(String, Option<bool>)>,
    fio_errors: Option<u64>,
    hung: HungReport,
}

impl Bench {
    fn fail(&mut self, what: &str, why: impl Into<String>) {
        let why = why.into();
        eprintln!("bench swap: {what}: FAILED: {why}");
        self.failures.insert(what.to_string(), json!(why));
    }

    fn set(&mut self, key: &str, value: f64) {
        self.metrics.insert(key.to_string(), if value.is_finite() { json!(value) } else { Value::Null });
    }

    fn check(&mut self, name: String, passed: Option<bool>) {
        self.checks.push((name, passed));
    }

    fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Whether a part may begin: not past the time budget, not interrupted. Records why not.
    fn may_begin(&mut self, part: &str) -> bool {
        if sys::interrupted() {
            self.fail(part, "skipped: interrupted");
            false
        } else if self.elapsed() > self.setup.budget_s {
            self.fail(part, format!("skipped: past the time budget of {:.0} s", self.setup.budget_s));
            false
        } else {
            true
        }
    }

    /// `want`, cut short near the hard end of the run (the budget and 90 s for the last part
    /// under way), but at least 20 s.
    fn limit(&self, want: Duration) -> Duration {
        let left = self.setup.budget_s + 90.0 - self.elapsed();
        want.min(Duration::from_secs_f64(left.max(20.0)))
    }

    fn fio_area(&self) -> u64 {
        if self.setup.quick {
            GIB
        } else {
            4 * GIB
        }
    }

    /// Swap space for the jobs: three jobs at once each leave up to their whole array there.
    fn swap_size(&self) -> u64 {
        (4 * self.setup.size).max(self.fio_area() + GIB)
    }

    fn verified(&self) -> bool {
        !self.checks.is_empty() && self.checks.iter().all(|(_, passed)| *passed == Some(true))
    }

    fn report(&self, partial: bool) -> (Value, Value) {
        let mut metrics = self.metrics.clone();
        metrics.insert("fio_verify_errors".into(), self.fio_errors.map_or(Value::Null, |e| json!(e)));
        let ratios = ratios(&metrics);
        let mut report = super::report(
            "vramswap",
            &self.commit,
            &self.date,
            &self.info,
            Value::Object(metrics),
            ratios,
            self.verified(),
        );
        report["failures"] = Value::Object(self.failures.clone());
        if partial {
            report["partial"] = json!(true);
        }
        let mut detail = self.detail.clone();
        detail.insert("suite".into(), json!("vramswap-detail"));
        detail.insert("commit".into(), json!(self.commit));
        detail.insert("date".into(), json!(self.date));
        detail.insert("seconds".into(), json!(self.elapsed()));
        detail.insert("checks".into(), self.checks.iter().map(|(n, p)| (n.clone(), json!(p))).collect());
        detail.insert("hung_vram".into(), json!(self.hung));
        detail.insert("failures".into(), Value::Object(self.failures.clone()));
        detail.insert("targets".into(), targets());
        (report, Value::Object(detail))
    }

    fn save(&self, partial: bool) {
        let (report, detail) = self.report(partial);
        if let Err(e) = super::write_report(&self.json_dir, "vramswap", &self.date, &self.commit, &report, &detail) {
            eprintln!("bench swap: {e}");
        }
    }

    fn note(&mut self, path: &[&str], value: Value) {
        let mut at = &mut self.detail;
        for key in &path[..path.len() - 1] {
            let entry = at.entry(key.to_string()).or_insert_with(|| json!({}));
            if !entry.is_object() {
                *entry = json!({});
            }
            at = entry.as_object_mut().expect("an object");
        }
        at.insert(path[path.len() - 1].to_string(), value);
    }

    // ------------------------------------------------------------ fio

    fn fio_all(&mut self) {
        let found = match &self.setup.fio {
            Some(given) => {
                given.is_file().then(|| given.clone()).ok_or(format!("--fio {}: no such file", given.display()))
            }
            None => sys::which("fio").ok_or_else(|| "no fio on PATH (and no --fio)".to_string()),
        };
        let fio = match found {
            Ok(f) => f,
            Err(why) => {
                self.fail("fio", format!("{why}: no device measurements"));
                for kind in [Kind::Vram, Kind::Disk, Kind::Zram] {
                    self.check(format!("fio_verify_{}", kind.name()), None);
                }
                self.check("fio_verify_vram_after_giveback".into(), None);
                return;
            }
        };
        let (engine, why) = swap_fio::probe_engine(&fio, &self.setup.dir.join(format!("{PREFIX}probe")));
        eprintln!(
            "bench swap: fio {} with {}{}",
            fio.display(),
            engine.name(),
            why.as_ref().map_or(String::new(), |w| format!(" ({w})"))
        );
        self.note(&["fio", "binary"], json!(fio.display().to_string()));
        self.note(&["fio", "engine"], json!(engine.name()));
        self.note(&["fio", "engine_why"], json!(why));
        self.note(
            &["fio", "queue_depth_32_by"],
            json!(match engine {
                IoEngine::IoUring => "io_uring, iodepth 32",
                IoEngine::Pvsync2 => "pvsync2, 32 threads of one request each (numjobs), each on its own slice",
            }),
        );
        for kind in [Kind::Disk, Kind::Zram, Kind::Vram] {
            if self.may_begin(&format!("fio_{}", kind.name())) {
                self.fio_device(&fio, engine, kind);
            } else {
                self.check(format!("fio_verify_{}", kind.name()), None);
                if kind == Kind::Vram {
                    self.check("fio_verify_vram_after_giveback".into(), None);
                }
            }
            self.save(true);
        }
    }

    fn fio_device(&mut self, fio: &Path, engine: IoEngine, kind: Kind) {
        let area = self.fio_area();
        let dir = self.setup.dir.clone();
        // Field order is drop order: the device goes before the file under it.
        struct DiskTarget {
            _device: sys::Loop,
            _file: sys::TempFile,
        }
        let mut _disk = None;
        let mut _zram = None;
        // Removed after the server is gone (declared before it: dropped after it).
        let _spill = sys::TempFile(dir.join(format!("{PREFIX}spill")));
        let mut vram = None;
        let devices = match kind {
            Kind::Disk => sys::TempFile::allocated(dir.join(format!("{PREFIX}fio-disk")), area).and_then(|file| {
                let lp = sys::Loop::attach(&file.0)?;
                self.note(&["fio", "disk", "loop_direct_io"], json!(lp.dio));
                let devices = vec![lp.device.clone()];
                _disk = Some(DiskTarget { _device: lp, _file: file });
                Ok(devices)
            }),
            Kind::Zram => sys::Zram::create(area + 64 * MIB, &dir).map(|z| {
                self.note(&["fio", "zram", "algorithm"], json!(z.algorithm));
                let devices = vec![z.device.clone()];
                _zram = Some(z);
                devices
            }),
            Kind::Vram => sys::VramSwap::on(
                &self.exe,
                self.swap_size(),
                &dir.join(format!("{PREFIX}spill")),
                false,
                &self.setup.swap_args,
            )
            .map(|v| {
                let devices = v.devices.clone();
                vram = Some(v);
                devices
            }),
        };
        let devices = match devices {
            Ok(d) => d,
            Err(e) => {
                self.fail(&format!("fio_{}", kind.name()), format!("setting up the device: {e}"));
                self.check(format!("fio_verify_{}", kind.name()), None);
                if kind == Kind::Vram {
                    self.check("fio_verify_vram_after_giveback".into(), None);
                }
                return;
            }
        };
        eprintln!("bench swap: fio on {} ({})", kind.name(), devices.join(", "));
        self.note(&["fio", kind.name(), "devices"], json!(devices));
        let watch = (kind == Kind::Vram).then(HungWatch::start);
        let rand_verify_size = match (engine, self.setup.quick) {
            (IoEngine::IoUring, false) => 256 * MIB,
            _ => 64 * MIB,
        };
        let (jobs, rand_verify) = fio_jobs(area, if self.setup.quick { 1000 } else { 3000 }, rand_verify_size);
        let p = kind.prefix();
        let mut verify_errors: Option<u64> = Some(0);
        for job in &jobs {
            if sys::interrupted() {
                verify_errors = None;
                break;
            }
            // Size-based jobs: at least 20 MB/s, or they count as stuck.
            let limit = Duration::from_secs(60) + Duration::from_secs_f64(job.size as f64 / 20e6);
            let limit = self.limit(job.runtime_ms.map_or(limit, |ms| Duration::from_millis(ms + 60_000)));
            let outcome = swap_fio::run(fio, engine, job, &devices, limit);
            let key = format!("{p}{}", job.name);
            match outcome {
                Err(e) => {
                    self.fail(&format!("fio_{key}"), e);
                    if job.verify != Verify::No {
                        verify_errors = None;
                    }
                }
                Ok(o) => {
                    eprintln!(
                        "bench swap:   {:<26} read {:>9.0} IOPS {:>6.2} GB/s {:>8.1} µs | write {:>9.0} IOPS {:>6.2} GB/s | errors {}",
                        job.name,
                        o.read.iops,
                        o.read.bw_bytes / 1e9,
                        o.read.lat_mean_us,
                        o.write.iops,
                        o.write.bw_bytes / 1e9,
                        o.errors
                    );
                    self.note(&["fio", kind.name(), job.name], outcome_json(&o));
                    if job.verify != Verify::No {
                        verify_errors = verify_errors.map(|e| e + o.errors);
                    } else if o.errors > 0 {
                        self.fail(
                            &format!("fio_{key}"),
                            format!("fio reported {} errors, codes {:?}", o.errors, o.error_codes),
                        );
                        continue;
                    }
                    self.fio_metrics(p, job.name, &o);
                }
            }
        }
        self.record_verify(&format!("fio_verify_{}", kind.name()), verify_errors);
        if let Some(v) = &vram {
            self.note(&["vram_status", "after_fio"], v.status());
            self.giveback(fio, engine, v, &rand_verify, &devices);
            self.note(&["vram_status", "after_giveback"], v.status());
        }
        if let Some(w) = watch {
            self.add_hung(w.finish(), "fio_vram");
        }
    }

    fn fio_metrics(&mut self, p: &str, job: &str, o: &swap_fio::Outcome) {
        let (r, w) = (&o.read, &o.write);
        let opt = |v: Option<f64>| v.unwrap_or(f64::NAN);
        match job {
            "seq-write" => self.set(&format!("{p}seq_write_GBps"), w.bw_bytes / 1e9),
            "seq-read" => self.set(&format!("{p}seq_read_GBps"), r.bw_bytes / 1e9),
            "rand4k-read-qd1" => {
                self.set(&format!("{p}rand4k_read_iops_qd1"), r.iops);
                self.set(&format!("{p}rand4k_read_lat_us_qd1"), r.lat_mean_us);
                self.set(&format!("{p}rand4k_read_lat_us_qd1_p50"), opt(r.lat_p50_us));
                self.set(&format!("{p}rand4k_read_lat_us_qd1_p99"), opt(r.lat_p99_us));
            }
            "rand4k-read-qd32" => self.set(&format!("{p}rand4k_read_iops_qd32"), r.iops),
            "rand4k-write-qd1" => {
                self.set(&format!("{p}rand4k_write_iops_qd1"), w.iops);
                self.set(&format!("{p}rand4k_write_lat_us_qd1"), w.lat_mean_us);
            }
            "rand4k-write-qd32" => self.set(&format!("{p}rand4k_write_iops_qd32"), w.iops),
            "rand32k-read-qd1" => {
                self.set(&format!("{p}rand32k_read_iops_qd1"), r.iops);
                self.set(&format!("{p}rand32k_read_lat_us_qd1"), r.lat_mean_us);
                self.set(&format!("{p}rand32k_read_lat_us_qd1_p50"), opt(r.lat_p50_us));
                self.set(&format!("{p}rand32k_read_lat_us_qd1_p99"), opt(r.lat_p99_us));
            }
            "seq-write-verify" => self.set(&format!("{p}seq_write_verify_GBps"), w.bw_bytes / 1e9),
            "rand4k-write-verify-qd32" => self.set(&format!("{p}rand4k_write_verify_iops_qd32"), w.iops),
            _ => {}
        }
    }

    /// Records a verification: `None` when it did not run (through).
    fn record_verify(&mut self, name: &str, errors: Option<u64>) {
        if let Some(e) = errors {
            self.fio_errors = Some(self.fio_errors.unwrap_or(0) + e);
        }
        self.check(name.to_string(), errors.map(|e| e == 0));
    }

    /// Forces the VRAM device's HBM cap to 0 while it holds fio's blocks; then checks the
    /// random verify pass's blocks again (now served from the spill file).
    fn giveback(&mut self, fio: &Path, engine: IoEngine, v: &sys::VramSwap, rand_verify: &Job, devices: &[String]) {
        if sys::interrupted() {
            self.check("fio_verify_vram_after_giveback".into(), None);
            return;
        }
        eprintln!("bench swap: give-back: the VRAM device's HBM cap to 0");
        match v.set_cap(0) {
            Ok((seconds, bytes)) => {
                eprintln!("bench swap:   {:.2} GB moved out in {seconds:.2} s", bytes / 1e9);
                self.note(&["giveback"], json!({"seconds": seconds, "bytes": bytes}));
                self.set("giveback_s", seconds);
                if bytes <= 0.0 {
                    self.fail("giveback_GBps", format!("tiermem swap cap 0 moved no bytes (in {seconds} s)"));
                } else {
                    self.set("giveback_GBps", bytes / seconds.max(1e-9) / 1e9);
                }
            }
            Err(e) => self.fail("giveback_GBps", e),
        }
        let check = Job { name: "rand4k-verify-after-giveback", verify: Verify::CheckOnly, ..rand_verify.clone() };
        let limit = self.limit(Duration::from_secs(60) + Duration::from_secs_f64(check.size as f64 / 5e6));
        let errors = match swap_fio::run(fio, engine, &check, devices, limit) {
            Ok(o) => {
                eprintln!("bench swap:   blocks checked after give-back: {} errors", o.errors);
                self.note(&["fio", "vram", check.name], outcome_json(&o));
                Some(o.errors)
            }
            Err(e) => {
                self.fail("fio_verify_vram_after_giveback", e);
                None
            }
        };
        self.record_verify("fio_verify_vram_after_giveback", errors);
    }

    fn add_hung(&mut self, report: HungReport, during: &str) {
        eprintln!(
            "bench swap:   hung-task watch ({during}): {} hung, {} in D over 1 s, longest D {:.1} s",
            report.hung_tasks, report.tasks_in_d_over_1s, report.longest_d_s
        );
        self.note(&["hung", during], json!(report));
        self.hung.hung_tasks += report.hung_tasks;
        self.hung.tasks_in_d_over_1s += report.tasks_in_d_over_1s;
        self.hung.longest_d_s = self.hung.longest_d_s.max(report.longest_d_s);
        self.hung.samples += report.samples;
        self.hung.stuck.extend(report.stuck);
        self.set("hung_tasks", self.hung.hung_tasks as f64);
        self.set("longest_d_state_s", self.hung.longest_d_s);
    }

    // ------------------------------------------------------------ the swap-bound job

    fn jobs_all(&mut self) {
        let plan = [(Kind::Disk, &[1usize, 3][..]), (Kind::Zram, &[1][..]), (Kind::Vram, &[1, 3][..])];
        let skip_all = |b: &mut Self, why: &str| {
            for (kind, counts) in plan {
                for &n in counts {
                    b.fail(&job_metric(kind, n), why.to_string());
                    b.check(format!("jobs_{}x{n}", kind.name()), None);
                }
            }
        };
        let cgroups = match sys::Cgroups::create() {
            Ok(c) => c,
            Err(e) => return skip_all(self, &format!("no cgroup for the jobs: {e}")),
        };
        self.note(&["jobs", "cgroup"], json!(cgroups.path.display().to_string()));
        for (kind, counts) in plan {
            if self.may_begin(&format!("jobs_{}", kind.name())) {
                self.jobs_with(kind, counts, &cgroups);
            } else {
                for &n in counts {
                    self.check(format!("jobs_{}x{n}", kind.name()), None);
                }
            }
            self.save(true);
        }
    }

    /// The jobs with `kind` as the only swap: one alone, then `counts`' other numbers at once.
    fn jobs_with(&mut self, kind: Kind, counts: &[usize], cgroups: &sys::Cgroups) {
        let size = self.swap_size();
        let dir = self.setup.dir.clone();
        // Field order is drop order: swap off, then the loop device, then the file.
        struct DiskSwap {
            _on: sys::SwapOn,
            _device: Option<sys::Loop>,
            _file: sys::TempFile,
        }
        struct ZramSwap {
            _on: sys::SwapOn,
            _zram: sys::Zram,
        }
        let mut _disk = None;
        let mut _zram = None;
        let _spill = sys::TempFile(dir.join(format!("{PREFIX}spill")));
        let mut _vram = None;
        let ready: Result<(), String> = match kind {
            Kind::Disk => (|| {
                if sys::free_bytes(&dir) < size + GIB {
                    return Err(format!(
                        "{} has less than {} GiB free for the swap file",
                        dir.display(),
                        size / GIB + 1
                    ));
                }
                let file = sys::TempFile::allocated(dir.join(format!("{PREFIX}swapfile")), size)?;
                let path = file.0.display().to_string();
                match sys::SwapOn::enable(&path, 10) {
                    Ok(on) => {
                        self.note(&["jobs", "disk_swap"], json!(format!("swap file {path}")));
                        _disk = Some(DiskSwap { _on: on, _device: None, _file: file });
                    }
                    Err(e) => {
                        // File systems that refuse swap files: a loop device over the file.
                        let lp = sys::Loop::attach(&file.0)?;
                        let on = sys::SwapOn::enable(&lp.device, 10)?;
                        self.note(
                            &["jobs", "disk_swap"],
                            json!(format!(
                                "loop device {} (direct I/O {}) over {path}; a swap file was refused: {e}",
                                lp.device, lp.dio
                            )),
                        );
                        _disk = Some(DiskSwap { _on: on, _device: Some(lp), _file: file });
                    }
                }
                Ok(())
            })(),
            Kind::Zram => sys::Zram::create(size, &dir).and_then(|z| {
                self.note(&["jobs", "zram_algorithm"], json!(z.algorithm));
                let on = sys::SwapOn::enable(&z.device, 10)?;
                _zram = Some(ZramSwap { _on: on, _zram: z });
                Ok(())
            }),
            Kind::Vram => {
                sys::VramSwap::on(&self.exe, size, &dir.join(format!("{PREFIX}spill")), true, &self.setup.swap_args)
                    .map(|v| {
                        self.note(&["jobs", "vram_devices"], json!(v.devices));
                        _vram = Some(v);
                    })
            }
        };
        if let Err(e) = ready {
            for &n in counts {
                self.fail(&job_metric(kind, n), format!("setting up {} swap: {e}", kind.name()));
                self.check(format!("jobs_{}x{n}", kind.name()), None);
            }
            return;
        }
        let active = sys::active_swaps();
        if active.is_empty() {
            for &n in counts {
                self.fail(&job_metric(kind, n), format!("no swap area active after setting up {} swap", kind.name()));
                self.check(format!("jobs_{}x{n}", kind.name()), None);
            }
            return;
        }
        eprintln!(
            "bench swap: jobs with {} swap (active: {})",
            kind.name(),
            active.iter().map(|a| format!("{} prio {}", a.path, a.priority)).collect::<Vec<_>>().join(", ")
        );
        self.note(&["jobs", kind.name(), "swaps_active"], json!(active.iter().map(|a| &a.path).collect::<Vec<_>>()));
        let watch = HungWatch::start();
        for &n in counts {
            if sys::interrupted() {
                self.check(format!("jobs_{}x{n}", kind.name()), None);
                continue;
            }
            let key = job_metric(kind, n);
            match self.job_set(kind, n, cgroups) {
                Ok((seconds, detail, ok)) => {
                    eprintln!("bench swap:   {n} job(s): {seconds:.1} s, every word checked: {ok}");
                    self.note(&["jobs", kind.name(), &format!("x{n}")], detail.clone());
                    self.check(format!("jobs_{}x{n}", kind.name()), Some(ok));
                    if ok {
                        self.set(&key, seconds);
                    } else {
                        self.fail(&key, format!("a job failed or a word differed: {detail}"));
                    }
                }
                Err(e) => {
                    self.fail(&key, e);
                    self.check(format!("jobs_{}x{n}", kind.name()), None);
                }
            }
        }
        let report = watch.finish();
        if kind == Kind::Vram {
            self.add_hung(report, "jobs_vram");
            if let Some(v) = &_vram {
                self.note(&["vram_status", "after_jobs"], v.status());
            }
        } else {
            eprintln!(
                "bench swap:   ({} swap: {} tasks hung, longest D {:.1} s)",
                kind.name(),
                report.hung_tasks,
                report.longest_d_s
            );
            self.note(&["hung", &format!("jobs_{}", kind.name())], json!(report));
        }
    }

    /// `n` jobs at once, each in its own cgroup: (the slowest one's seconds, detail, all checked out).
    fn job_set(&mut self, kind: Kind, n: usize, cgroups: &sys::Cgroups) -> Result<(f64, Value, bool), String> {
        let size = self.setup.size;
        let before = sys::vmstat();
        let limit = self.limit(Duration::from_secs_f64(if self.setup.quick { 120.0 } else { 300.0 }));
        let mut running: Vec<(Child, PathBuf, PathBuf)> = Vec::new();
        let started = Instant::now();
        let spawned = (0..n).try_for_each(|k| {
            let cgroup = cgroups.child(&format!("{}-x{n}-{k}", kind.name()), size / 2)?;
            let out = std::env::temp_dir().join(format!("{PREFIX}job-{}-{k}.json", std::process::id()));
            let file = std::fs::File::create(&out).map_err(|e| format!("create {}: {e}", out.display()))?;
            let child = Command::new(&self.exe)
                .args(["bench", "swap-job", "--size", &size.to_string(), "--passes", &self.setup.passes.to_string()])
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
            "working_set_bytes": size, "memory_max_bytes": size / 2, "passes": self.setup.passes,
            "swapped_in_bytes": delta("pswpin"), "swapped_out_bytes": delta("pswpout"),
        });
        match stopped {
            Some(why) => Err(format!("{why}: {detail}")),
            None => Ok((slowest, detail, all_ok)),
        }
    }
}

/// The fio jobs run on each device, in order, and the random verify pass (the last of them,
/// checked again after give-back). `area`: bytes over all the device's files.
fn fio_jobs(area: u64, runtime_ms: u64, rand_verify_size: u64) -> (Vec<Job>, Job) {
    let timed =
        |name, rw, bs, depth| Job { name, rw, bs, depth, size: area, runtime_ms: Some(runtime_ms), verify: Verify::No };
    let rand_verify = Job {
        name: "rand4k-write-verify-qd32",
        rw: "randwrite",
        bs: 4096,
        depth: 32,
        size: rand_verify_size,
        runtime_ms: None,
        verify: Verify::WriteThenCheck,
    };
    let jobs = vec![
        // Also fills the region, so that every later read finds written blocks.
        Job { name: "seq-write", rw: "write", bs: MIB, depth: 16, size: area, runtime_ms: None, verify: Verify::No },
        timed("seq-read", "read", MIB, 16),
        timed("rand4k-read-qd1", "randread", 4096, 1),
        timed("rand4k-read-qd32", "randread", 4096, 32),
        timed("rand4k-write-qd1", "randwrite", 4096, 1),
        timed("rand4k-write-qd32", "randwrite", 4096, 32),
        timed("rand32k-read-qd1", "randread", 32 << 10, 1),
        Job {
            name: "seq-write-verify",
            rw: "write",
            bs: MIB,
            depth: 16,
            size: area.min(GIB),
            runtime_ms: None,
            verify: Verify::WriteThenCheck,
        },
        rand_verify.clone(),
    ];
    (jobs, rand_verify)
}

fn job_metric(kind: Kind, n: usize) -> String {
    match n {
        1 => format!("job_s_{}", kind.name()),
        n => format!("job{n}_s_{}", kind.name()),
    }
}

fn outcome_json(o: &swap_fio::Outcome) -> Value {
    let side = |s: &swap_fio::Side| {
        json!({
            "iops": s.iops, "GBps": s.bw_bytes / 1e9, "bytes": s.io_bytes,
            "lat_mean_us": s.lat_mean_us, "lat_p50_us": s.lat_p50_us, "lat_p99_us": s.lat_p99_us,
        })
    };
    json!({"read": side(&o.read), "write": side(&o.write), "errors": o.errors, "error_codes": o.error_codes})
}

pub fn run(json_dir: &Path, commit: &str, setup: Setup) -> Result<(), String> {
    if std::env::var("TIERMEM_ALLOW_SWAP").as_deref() != Ok("1") {
        return Err("bench swap: refused without TIERMEM_ALLOW_SWAP=1: it enables swap and attaches loop devices, \
                    which can hang a shared machine for everyone; set it only on a machine of your own (the GPU \
                    machine: scripts/gpu/run.sh sets it for its swap phase)"
            .into());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("bench swap: needs root (it enables swap, attaches loop devices, makes cgroups); \
                    run it on the GPU machine only, never on a shared machine"
            .into());
    }
    std::fs::create_dir_all(&setup.dir).map_err(|e| format!("bench swap: create {}: {e}", setup.dir.display()))?;
    let dir = setup.dir.canonicalize().map_err(|e| format!("bench swap: {}: {e}", setup.dir.display()))?;
    if sys::in_memory_fs(&dir)? {
        return Err(format!(
            "bench swap: {} is in memory (tmpfs): a loop device or swap file there can deadlock the kernel; \
             give --dir on the local disk",
            dir.display()
        ));
    }
    sys::catch_signals();
    let config = tiermem::EngineConfig::from_env().map_err(|e| e.to_string())?;
    let info = {
        let (device, fallback) = tiermem::mechanism::open(config.backend, config.device, config.sim_hbm)
            .map_err(|e| format!("bench swap: {e}"))?;
        if let Some(why) = fallback {
            eprintln!("WARNING: no GPU ({why}): the VRAM numbers are not GPU measurements and must not be committed.");
        }
        device.info().clone()
    };
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut bench = Bench {
        setup: Setup { dir, ..setup },
        commit: commit.to_string(),
        date: super::today(),
        json_dir: json_dir.to_path_buf(),
        info,
        exe,
        started: Instant::now(),
        metrics: metric_keys().into_iter().map(|k| (k, Value::Null)).collect(),
        failures: Map::new(),
        detail: Map::new(),
        checks: Vec::new(),
        fio_errors: None,
        hung: HungReport::default(),
    };
    let s = &bench.setup;
    eprintln!(
        "bench swap on {}: job {} GiB × {} passes (cgroup memory.max half of it), fio over {} GiB, swap devices of {} GiB, files in {}{}",
        bench.info.name,
        s.size as f64 / GIB as f64,
        s.passes,
        bench.fio_area() / GIB,
        bench.swap_size() / GIB,
        s.dir.display(),
        if s.quick { " (quick)" } else { "" }
    );
    let setup_json = json!({
        "job_bytes": s.size, "job_passes": s.passes, "job_block_bytes": 256 << 10, "fio_area_bytes": bench.fio_area(),
        "swap_device_bytes": bench.swap_size(), "quick": s.quick, "dir": s.dir.display().to_string(),
        "swap_args": s.swap_args, "budget_s": s.budget_s, "nbd_vram_seq_read_GBps": NBD_VRAM_SEQ_READ_GBPS,
    });
    bench.note(&["setup"], setup_json);
    bench.note(&["settings"], sys::settings());
    bench.note(
        &["swaps_before"],
        json!(sys::active_swaps()
            .iter()
            .map(|a| json!({"path": a.path, "kind": a.kind, "priority": a.priority, "used_kib": a.used_kib}))
            .collect::<Vec<_>>()),
    );

    // Guards: dropped (undone) last, in reverse order, whatever happens in between.
    let _zswap = match sys::ZswapOff::take(&bench.setup.dir) {
        Ok(z) => z,
        Err(e) => {
            bench.fail("zswap", format!("could not turn zswap off (the devices are measured behind it): {e}"));
            None
        }
    };
    let _others = match sys::OtherSwapsOff::take() {
        Ok(g) => Some(g),
        Err(e) => {
            bench.fail("other_swaps", format!("a swap area active before could not be taken off: {e}"));
            None
        }
    };
    bench.fio_all();
    bench.jobs_all();
    bench.save(false);
    let (report, _) = bench.report(false);
    eprintln!("bench swap: done in {:.0} s", bench.elapsed());
    println!("metrics: {}", report["metrics"]);
    println!("ratios: {}", report["ratios"]);
    if !bench.failures.is_empty() {
        println!("failures: {}", Value::Object(bench.failures.clone()));
    }
    println!("verified: {}", bench.verified());
    if sys::interrupted() {
        return Err("bench swap: interrupted (everything set up was undone)".into());
    }
    if bench.verified() {
        Ok(())
    } else {
        Err("bench swap: a verification failed or did not run (see failures and the detail's checks)".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_the_issue_names_is_a_key() {
        let keys = metric_keys();
        for p in ["", "disk_", "zram_"] {
            for m in [
                "seq_read_GBps",
                "seq_write_GBps",
                "rand4k_read_iops_qd32",
                "rand4k_write_iops_qd32",
                "rand4k_read_lat_us_qd1",
                "rand32k_read_lat_us_qd1",
            ] {
                assert!(keys.contains(&format!("{p}{m}")), "{p}{m}");
            }
        }
        for k in ["giveback_GBps", "job_s_vram", "job_s_disk", "job_s_zram", "fio_verify_errors", "hung_tasks"] {
            assert!(keys.contains(&k.to_string()), "{k}");
        }
        assert_eq!(job_metric(Kind::Vram, 1), "job_s_vram");
        assert_eq!(job_metric(Kind::Disk, 3), "job3_s_disk");
        assert!(keys.contains(&job_metric(Kind::Disk, 3)) && keys.contains(&job_metric(Kind::Vram, 3)));
    }

    #[test]
    fn ratios_are_null_where_a_side_is_missing() {
        let mut m: Map<String, Value> = metric_keys().into_iter().map(|k| (k, Value::Null)).collect();
        m.insert("job_s_vram".into(), json!(10.0));
        m.insert("job_s_disk".into(), json!(25.0));
        m.insert("seq_read_GBps".into(), json!(8.1));
        let r = ratios(&m);
        assert_eq!(r["job_vs_disk"], json!(2.5));
        assert_eq!(r["job_vs_zram"], Value::Null);
        assert!((r["seq_read_vs_nbd_vram"].as_f64().unwrap() - 3.0).abs() < 1e-9);
        for key in ["job_vs_disk", "job_vs_zram", "seq_read_vs_nbd_vram"] {
            assert!(r.get(key).is_some(), "{key}");
        }
    }

    fn bench(dir: &Path) -> Bench {
        Bench {
            setup: Setup {
                dir: dir.to_path_buf(),
                size: GIB,
                passes: 1.0,
                quick: true,
                fio: None,
                swap_args: Vec::new(),
                budget_s: 100.0,
            },
            commit: "0123456789abcdef".into(),
            date: "2026-11-23".into(),
            json_dir: dir.to_path_buf(),
            info: tiermem::mechanism::DeviceInfo {
                backend: tiermem::mechanism::BackendKind::Sim,
                ordinal: 0,
                name: "test".into(),
                device_count: 1,
                driver_version: "none".into(),
                cuda_version: "none".into(),
                total_bytes: 0,
                granularity: 2 << 20,
                vmm_supported: false,
                peers: Vec::new(),
            },
            exe: PathBuf::from("/nonexistent"),
            started: Instant::now(),
            metrics: metric_keys().into_iter().map(|k| (k, Value::Null)).collect(),
            failures: Map::new(),
            detail: Map::new(),
            checks: Vec::new(),
            fio_errors: None,
            hung: HungReport::default(),
        }
    }

    #[test]
    fn the_report_has_the_suites_keys_and_nulls_with_reasons() {
        let dir = std::env::temp_dir().join(format!("tiermem-swap-report-{}", std::process::id()));
        let mut b = bench(&dir);
        b.set("seq_read_GBps", 9.0);
        b.set("job_s_vram", 12.0);
        b.set("job_s_disk", 30.0);
        b.fail("job_s_zram", "setting up zram swap: no zram module");
        b.record_verify("fio_verify_vram", Some(0));
        b.check("jobs_vramx1".into(), Some(true));
        b.add_hung(HungReport { hung_tasks: 0, longest_d_s: 0.4, samples: 5, ..Default::default() }, "jobs_vram");
        let (report, detail) = b.report(true);
        for key in ["suite", "commit", "date", "device", "metrics", "ratios", "verified", "failures"] {
            assert!(report.get(key).is_some(), "{key}: {report}");
        }
        assert_eq!(report["suite"], "vramswap");
        assert_eq!(report["partial"], true);
        assert_eq!(report["metrics"]["job_s_zram"], Value::Null);
        assert_eq!(report["metrics"]["fio_verify_errors"], 0);
        assert_eq!(report["metrics"]["hung_tasks"], 0.0);
        assert_eq!(report["failures"]["job_s_zram"], "setting up zram swap: no zram module");
        assert_eq!(report["ratios"]["job_vs_disk"], 2.5);
        assert_eq!(report["verified"], true);
        assert_eq!(detail["checks"]["fio_verify_vram"], true);
        assert!(detail["targets"]["job_vs_disk"].is_string());
        // A verification that did not run leaves the run unverified.
        b.check("jobs_diskx1".into(), None);
        assert_eq!(b.report(false).0["verified"], false);
        b.save(false);
        let written = std::fs::read_to_string(dir.join("vramswap-20261123-0123456.json")).unwrap();
        let back: Value = serde_json::from_str(&written).unwrap();
        assert!(back.get("partial").is_none());
        assert!(dir.join("vramswap-20261123-0123456.detail.json").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn failed_verification_counts_errors() {
        let mut b = bench(Path::new("/nonexistent"));
        b.record_verify("fio_verify_disk", Some(0));
        b.record_verify("fio_verify_vram", Some(3));
        assert_eq!(b.fio_errors, Some(3));
        assert!(!b.verified());
    }
    /// The jobs as run on each device, over two plain files standing in for two loop devices,
    /// with both engines; then the check after give-back. Skipped without fio (TIERMEM_FIO or
    /// fio on PATH).
    #[test]
    fn the_fio_jobs_run_and_verify_on_plain_files() {
        let Some(fio) = std::env::var_os("TIERMEM_FIO").map(PathBuf::from).or_else(|| sys::which("fio")) else {
            eprintln!("skipped: no fio (set TIERMEM_FIO)");
            return;
        };
        let dir = std::env::var_os("TIERMEM_TEST_FILE_DIR").map_or_else(std::env::temp_dir, Into::into);
        let files: Vec<String> = (0..2)
            .map(|k| dir.join(format!("tiermem-fio-jobs-{}-{k}", std::process::id())).display().to_string())
            .collect();
        for engine in [IoEngine::IoUring, IoEngine::Pvsync2] {
            let (jobs, rand_verify) = fio_jobs(64 * MIB, 200, 8 * MIB);
            for job in jobs.iter().chain([&Job { verify: Verify::CheckOnly, ..rand_verify.clone() }]) {
                let o = swap_fio::run(&fio, engine, job, &files, Duration::from_secs(60))
                    .unwrap_or_else(|e| panic!("{engine:?} {}: {e}", job.name));
                assert_eq!(o.errors, 0, "{engine:?} {}: {o:?}", job.name);
                let moved = if job.rw.contains("read") { o.read.io_bytes } else { o.write.io_bytes };
                assert!(moved > 0.0, "{engine:?} {}: {o:?}", job.name);
                if job.runtime_ms.is_none() && job.verify == Verify::No {
                    assert_eq!(o.write.io_bytes as u64, job.size, "{engine:?} {} writes its region once", job.name);
                }
            }
        }
        for f in &files {
            let _ = std::fs::remove_file(f);
        }
    }
}
