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
//! goes on. Everything set up is undone by guards (`swap_sys/`), also on errors and signals;
//! scripts/gpu/run.sh also cleans up after it. The report is rewritten after each part (with
//! `"partial": true`) so that a run cut short still leaves its numbers.
//!
//! Here: the run's setup, its checks before it starts, and the time budget. The parts:
//! `fio_phase` (fio on each device), `giveback`, `jobs_phase` (the swap-bound jobs); the
//! devices they set up, `targets`; what the run records and the report made of it, `report`.

mod fio_phase;
mod giveback;
mod jobs_phase;
mod report;
mod targets;

use super::swap_sys::{self as sys, PREFIX};
use report::Record;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// nbd-vram's published sequential read, GB/s (the baseline).
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
    /// `vm.page-cluster` for the whole run (every device alike); `None`: as the machine has it.
    pub page_cluster: Option<u32>,
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

/// The run's context: what it measures with, where, since when. What it records is a
/// [`report::Record`], beside it.
struct Bench {
    setup: Setup,
    commit: String,
    date: String,
    json_dir: PathBuf,
    info: tiermem::mechanism::DeviceInfo,
    exe: PathBuf,
    started: Instant,
}

impl Bench {
    fn new(
        setup: Setup,
        commit: &str,
        date: String,
        json_dir: &Path,
        info: tiermem::mechanism::DeviceInfo,
        exe: PathBuf,
    ) -> Self {
        let (commit, json_dir, started) = (commit.to_string(), json_dir.to_path_buf(), Instant::now());
        Bench { setup, commit, date, json_dir, info, exe, started }
    }

    fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Whether a part may begin: not past the time budget, not interrupted. Records why not.
    fn may_begin(&self, record: &mut Record, part: &str) -> bool {
        if sys::interrupted() {
            record.fail(part, "skipped: interrupted");
            false
        } else if self.elapsed() > self.setup.budget_s {
            record.fail(part, format!("skipped: past the time budget of {:.0} s", self.setup.budget_s));
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

    /// The path of the benchmark's file `name` in its folder (`PREFIX` in front).
    fn file(&self, name: &str) -> PathBuf {
        self.setup.dir.join(format!("{PREFIX}{name}"))
    }
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
    let exe = crate::native_program("bench swap")?;
    let bench = Bench::new(Setup { dir, ..setup }, commit, super::today(), json_dir, info, exe);
    let mut record = Record::new();
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
        "page_cluster": s.page_cluster,
    });
    record.note(&["setup"], setup_json);
    record.note(&["settings"], sys::settings());
    record.note(
        &["swaps_before"],
        json!(sys::active_swaps()
            .iter()
            .map(
                |a| json!({"path": a.filename, "kind": a.kind, "priority": a.priority, "used_kib": a.used_bytes / 1024})
            )
            .collect::<Vec<_>>()),
    );

    // Guards: dropped (undone) last, in reverse order, whatever happens in between.
    let _zswap = match sys::ZswapOff::take(&bench.setup.dir) {
        Ok(z) => z,
        Err(e) => {
            record.fail("zswap", format!("could not turn zswap off (the devices are measured behind it): {e}"));
            None
        }
    };
    let _page_cluster = match bench.setup.page_cluster.map(|n| sys::PageCluster::set(&bench.setup.dir, n)) {
        Some(Err(e)) => return Err(format!("bench swap: {e}")),
        Some(Ok(guard)) => Some(guard),
        None => None,
    };
    let _others = match sys::OtherSwapsOff::take() {
        Ok(g) => Some(g),
        Err(e) => {
            record.fail("other_swaps", format!("a swap area active before could not be taken off: {e}"));
            None
        }
    };
    fio_phase::fio_all(&bench, &mut record);
    jobs_phase::jobs_all(&bench, &mut record);
    record.save(&bench, false);
    let (report, _) = record.report(&bench, false);
    eprintln!("bench swap: done in {:.0} s", bench.elapsed());
    println!("metrics: {}", report["metrics"]);
    println!("ratios: {}", report["ratios"]);
    if !record.failures().is_empty() {
        println!("failures: {}", Value::Object(record.failures().clone()));
    }
    println!("verified: {}", record.verified());
    if sys::interrupted() {
        return Err("bench swap: interrupted (everything set up was undone)".into());
    }
    if record.verified() {
        Ok(())
    } else {
        Err("bench swap: a verification failed or did not run (see failures and the detail's checks)".into())
    }
}

/// A run for the tests: quick, of a 1 GiB job, on a simulated device, writing into `dir`.
#[cfg(test)]
fn test_bench(dir: &Path) -> Bench {
    let setup = Setup {
        dir: dir.to_path_buf(),
        size: GIB,
        passes: 1.0,
        quick: true,
        fio: None,
        swap_args: Vec::new(),
        budget_s: 100.0,
        page_cluster: None,
    };
    let info = tiermem::mechanism::DeviceInfo {
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
        uuid: None,
    };
    Bench::new(setup, "0123456789abcdef", "2026-11-23".into(), dir, info, PathBuf::from("/nonexistent"))
}
