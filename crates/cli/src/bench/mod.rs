//! `tiermem bench SUITE --json DIR`: benchmarks whose results are committed under bench/results/.
//! Each suite measures its ceilings in the same run, reports medians, verifies every byte.

mod engine;
mod nvme;
mod peer;
mod peer_engine;
mod peer_in_place;
pub(crate) mod raw;
mod swap;
mod swap_fio;
mod swap_job;
mod swap_store;
mod swap_sys;
mod tenant_worker;
mod tenants;
mod transparent;

use std::path::PathBuf;

#[derive(clap::Subcommand)]
pub enum Suite {
    /// The chunk engine against the raw PCIe copy ceilings (HBM ⇄ pinned host).
    Engine {
        /// Folder to write engine-<yyyymmdd>-<shortsha>.json into.
        #[arg(long)]
        json: PathBuf,
        /// Commit being measured (default: $TIERMEM_COMMIT, else the commit this binary was built from).
        #[arg(long)]
        commit: Option<String>,
        /// Repetitions of each timed operation (the median is reported).
        #[arg(long, default_value_t = 10)]
        reps: usize,
        /// Size of the large transfers.
        #[arg(long, value_parser = tiermem::parse_size, default_value = "1GiB")]
        size: usize,
    },
    /// Paging to a file on NVMe against the disk's own speed, direct I/O and demand paging.
    Nvme {
        /// Folder to write nvme-<yyyymmdd>-<shortsha>.json into.
        #[arg(long)]
        json: PathBuf,
        /// Folder on the disk to measure (must allow O_DIRECT; about 5× --size of free space).
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Commit being measured (default: $TIERMEM_COMMIT, else the commit this binary was built from).
        #[arg(long)]
        commit: Option<String>,
        /// Repetitions of each timed operation (the median is reported).
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// Size of the buffer and of each transfer.
        #[arg(long, value_parser = tiermem::parse_size, default_value = "1GiB")]
        size: usize,
    },
    /// Processes sharing one GPU: static caps against tiermemd, serial runs, a hog, a leaker,
    /// fair shares, pairs of jobs that together exceed the cap.
    Tenants {
        /// Folder to write tenants-<yyyymmdd>-<shortsha>.json into.
        #[arg(long)]
        json: PathBuf,
        /// Commit being measured (default: $TIERMEM_COMMIT, else the commit this binary was built from).
        #[arg(long)]
        commit: Option<String>,
        /// The node's HBM cap that the tenants share.
        #[arg(long, value_parser = tiermem::parse_size, default_value = "8GiB")]
        cap: usize,
        /// Size of each tenant's buffers.
        #[arg(long, value_parser = tiermem::parse_size, default_value = "128MiB")]
        buffer_size: usize,
        /// Rounds of the shortest job (the others run 2× and 3× as many). 20 makes jobs of about
        /// 2 to 6 s on an H100/H200, longer than the daemon's settling (`ramp_ms`, 3 s); with 5
        /// (the default before the twenty-ninth session) they took 0.4 to 1.2 s, mostly start-up.
        #[arg(long, default_value_t = 20)]
        rounds: u64,
        /// Host time per buffer's turn, in milliseconds (a job's work between its kernels).
        #[arg(long, default_value_t = 2.0)]
        think_ms: f64,
        /// The daemon's `idle_after_ms` (0: no tenant is ever idle, for comparison).
        #[arg(long, default_value_t = 500)]
        idle_after_ms: u64,
        /// The daemon's `ramp_ms` (0: a newcomer lends what it does not use at once).
        #[arg(long, default_value_t = 3000)]
        ramp_ms: u64,
        /// Only the throughput sets (static, tiermemd fair and in turns, serial): a quicker
        /// A/B; the report then lacks the other scenarios' metrics.
        #[arg(long)]
        throughput_only: bool,
        /// Keep the daemons' logs, as tenants-daemon-<sharing>.log in the --json folder.
        #[arg(long)]
        daemon_logs: bool,
        /// Runs of each throughput set, the modes alternating; the report gives their medians.
        /// Five: on the H200 static caps' runs spread over 6%, the daemon's over 1.4%.
        #[arg(long, default_value_t = 5)]
        repeats: usize,
    },
    /// One tenant of `bench tenants` (a process of its own).
    #[command(hide = true)]
    TenantWorker(tenant_worker::WorkerArgs),
    /// CPU programs borrowing idle VRAM as swap, against swap on the local disk and zram: fio
    /// on each device, give-back, a swap-bound job with each (issue 14). Root; enables swap and
    /// attaches loop devices, undoing it all at the end: run it on the GPU machine only, never
    /// on a shared machine.
    Swap {
        /// Folder to write vramswap-<yyyymmdd>-<shortsha>.json into.
        #[arg(long)]
        json: PathBuf,
        /// Commit being measured (default: $TIERMEM_COMMIT, else the commit this binary was built from).
        #[arg(long)]
        commit: Option<String>,
        /// Folder on the local disk (not tmpfs) for the disk device's file, the swap file and
        /// the VRAM device's spill file (about 5× --size free).
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Working set of each swap-bound job; its cgroup's memory.max is half of it
        /// [default: 4GiB, 1GiB with --quick].
        #[arg(long, value_parser = tiermem::parse_size)]
        size: Option<usize>,
        /// The job's random block updates, in passes over its array.
        #[arg(long, default_value_t = 1.0)]
        passes: f64,
        /// Small sizes and 1-second fio runs: a smoke test of the whole benchmark.
        #[arg(long)]
        quick: bool,
        /// fio's binary (default: fio on PATH).
        #[arg(long)]
        fio: Option<PathBuf>,
        /// Added to every `tiermem swap on`, split at spaces (e.g. "--devices 4").
        #[arg(long, allow_hyphen_values = true)]
        swap_args: Option<String>,
        /// Seconds after which parts not yet begun are skipped, and 90 s later the part under
        /// way is stopped [default: 400, 150 with --quick].
        #[arg(long)]
        budget_s: Option<f64>,
        /// Sets vm.page-cluster (swap-in reads 2^N pages around the one faulted) for the whole
        /// run, every device alike, and puts the old value back at the end [default: unchanged].
        #[arg(long)]
        page_cluster: Option<u32>,
    },
    /// The VRAM swap device's store alone, with no kernel devices and no root (safe on a shared
    /// machine): 4 and 32 KiB reads and 4 KiB writes at queue depth 1 and from 8 threads, the
    /// read path's calls timed one by one, with and without loops learned from the acquires.
    SwapStore {
        /// Folder to write vramswap-store-<yyyymmdd>-<shortsha>.json into.
        #[arg(long)]
        json: PathBuf,
        /// Commit being measured (default: $TIERMEM_COMMIT, else the commit this binary was built from).
        #[arg(long)]
        commit: Option<String>,
        /// The device's size, written whole before the timings (all of it in HBM).
        #[arg(long, value_parser = tiermem::parse_size, default_value = "1GiB")]
        size: usize,
        /// Timed requests of each kind (the 8-thread run shares them out).
        #[arg(long, default_value_t = 20000)]
        ops: usize,
    },
    /// A neighbour GPU's spare HBM as a tier (issue 12): tiermem's peer tier against the raw
    /// NVLink copy, reclaim by the lender, the lender's own job alone and while it lends.
    Peer {
        /// Folder to write peer-<yyyymmdd>-<shortsha>.json into.
        #[arg(long)]
        json: PathBuf,
        /// Commit being measured (default: $TIERMEM_COMMIT, else the commit this binary was built from).
        #[arg(long)]
        commit: Option<String>,
        /// The GPU that borrows.
        #[arg(long, default_value_t = 0)]
        borrower: usize,
        /// The GPU that lends.
        #[arg(long, default_value_t = 1)]
        lender: usize,
        /// Size of the buffer paged to the lender and of the raw copies.
        #[arg(long, value_parser = tiermem::parse_size, default_value = "1GiB")]
        size: usize,
        /// Repetitions of each timed operation (the median is reported).
        #[arg(long, default_value_t = 10)]
        reps: usize,
        /// Bytes the lender's own job writes per pass.
        #[arg(long, value_parser = tiermem::parse_size, default_value = "4GiB")]
        job_bytes: usize,
        /// Seconds the lender's job is timed, each time, after up to a second of warm-up (a
        /// program on the lender runs for a while; the borrower notices it within its polls).
        #[arg(long, default_value_t = 3.0)]
        job_seconds: f64,
        /// The torch benchmark's script (bench/torch_bench.py): its dense decode runs on GPU 0
        /// with TIERMEM_PEERS=auto and =off, for the decode figures (needs python3 and torch).
        #[arg(long)]
        decode: Option<PathBuf>,
    },
    /// Unmodified programs (issue 16): a PyTorch training loop plainly, under `tiermem run`
    /// with a budget above its peak and at 0.7× and 0.5× of it, and with the stock allocator
    /// capped at 0.7× (needs python3, torch, transformers, and libtiermem_preload.so beside
    /// the tiermem executable or at TIERMEM_PRELOAD).
    Transparent {
        /// Folder to write transparent-<yyyymmdd>-<shortsha>.json into.
        #[arg(long)]
        json: PathBuf,
        /// Commit being measured (default: $TIERMEM_COMMIT, else the commit this binary was built from).
        #[arg(long)]
        commit: Option<String>,
        /// The training script.
        #[arg(long, default_value = "bench/transparent_train.py")]
        script: PathBuf,
        /// Training steps per run (the first is not timed; migration settles over the first
        /// few, so the median of the rest is the steady state).
        #[arg(long, default_value_t = 12)]
        steps: usize,
        /// A model of a few hundred MiB: a smoke test of the suite, not a measurement.
        #[arg(long)]
        small: bool,
        /// The coverage matrix's programs to run (bench/transparent_matrix.py beside the
        /// script), comma-separated; `none` runs none. Default: all.
        #[arg(long)]
        matrix: Option<String>,
    },
    /// The swap-bound job of `bench swap` (a process of its own, in a memory-limited cgroup).
    #[command(hide = true)]
    SwapJob(swap_job::JobArgs),
}

/// The commit a result names: `given`, else `$TIERMEM_COMMIT`, else the commit this binary was
/// built from (build.rs), else "unknown" (built outside a git checkout).
pub fn measured_commit(given: Option<String>) -> String {
    given
        .or_else(|| std::env::var("TIERMEM_COMMIT").ok())
        .or_else(|| Some(env!("TIERMEM_BUILT_FROM").to_string()).filter(|c| !c.is_empty()))
        .unwrap_or_else(|| "unknown".into())
}

pub fn run(suite: Suite) -> Result<(), String> {
    match suite {
        Suite::Engine { json, commit: given, reps, size } => {
            engine::run(&json, &measured_commit(given), reps.max(1), size)
        }
        Suite::Nvme { json, dir, commit: given, reps, size } => {
            nvme::run(&json, &dir, &measured_commit(given), reps.max(1), size)
        }
        Suite::Tenants {
            json,
            commit: given,
            cap,
            buffer_size,
            rounds,
            think_ms,
            idle_after_ms,
            ramp_ms,
            throughput_only,
            daemon_logs,
            repeats,
        } => {
            let (rounds, think_ms) = (rounds.max(1), think_ms.max(0.0));
            let logs = daemon_logs.then(|| json.clone());
            let setup = tenants::Setup {
                cap,
                buffer: buffer_size,
                rounds,
                think_ms,
                idle_after_ms,
                ramp_ms,
                throughput_only,
                logs,
                repeats: repeats.max(1),
            };
            tenants::run(&json, &measured_commit(given), setup)
        }
        Suite::TenantWorker(args) => tenant_worker::run(args),
        Suite::Swap { json, commit: given, dir, size, passes, quick, fio, swap_args, budget_s, page_cluster } => {
            let setup = swap::Setup {
                dir,
                size: size.map_or(if quick { 1 << 30 } else { 4 << 30 }, |s| s as u64),
                passes: passes.max(0.0),
                quick,
                fio,
                swap_args: swap_args.unwrap_or_default().split_whitespace().map(String::from).collect(),
                budget_s: budget_s.unwrap_or(if quick { 150.0 } else { 400.0 }),
                page_cluster,
            };
            swap::run(&json, &measured_commit(given), setup)
        }
        Suite::SwapJob(args) => swap_job::run(args),
        Suite::SwapStore { json, commit: given, size, ops } => {
            swap_store::run(&json, &measured_commit(given), size, ops)
        }
        Suite::Transparent { json, commit: given, script, steps, small, matrix } => {
            let setup = transparent::Setup { script, steps: steps.max(2), small, matrix };
            transparent::run(&json, &measured_commit(given), setup)
        }
        Suite::Peer { json, commit: given, borrower, lender, size, reps, job_bytes, job_seconds, decode } => {
            let setup = peer::Setup { borrower, lender, size, reps: reps.max(1), job_bytes, job_seconds, decode };
            peer::run(&json, &measured_commit(given), setup)
        }
    }
}

/// A suite's report, with exactly the keys every suite's JSON has.
pub fn report(
    suite: &str,
    commit: &str,
    date: &str,
    device: &tiermem::mechanism::DeviceInfo,
    metrics: serde_json::Value,
    ratios: serde_json::Value,
    verified: bool,
) -> serde_json::Value {
    serde_json::json!({
        "suite": suite,
        "commit": commit,
        "date": date,
        "device": { "name": device.name, "count": device.device_count, "driver": device.driver_version },
        "metrics": metrics,
        "ratios": ratios,
        "verified": verified,
    })
}

/// Writes `<suite>-<yyyymmdd>-<shortsha>.json` (the report) and `….detail.json` into `dir`.
pub fn write_report(
    dir: &std::path::Path,
    suite: &str,
    date: &str,
    commit: &str,
    report: &serde_json::Value,
    detail: &serde_json::Value,
) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("bench: create {}: {e}", dir.display()))?;
    let short: String = commit.chars().take(7).collect();
    let stem = format!("{suite}-{}-{short}", date.replace('-', ""));
    for (name, value) in [(format!("{stem}.json"), report), (format!("{stem}.detail.json"), detail)] {
        let path = dir.join(name);
        let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
        std::fs::write(&path, text + "\n").map_err(|e| format!("bench: write {}: {e}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// Median of some measurements.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// The 99th percentile of some measurements (the value 99% of them do not exceed); 0 for none.
pub fn p99(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get((sorted.len() * 99 / 100).min(sorted.len().saturating_sub(1))).copied().unwrap_or(0.0)
}

/// Today's date as `YYYY-MM-DD` (UTC), from the system clock.
pub fn today() -> String {
    let days =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() / 86_400) as i64;
    // Civil-from-days (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(super::median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(super::median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    #[test]
    fn today_is_a_date() {
        let d = super::today();
        assert_eq!(d.len(), 10);
        assert!(d.starts_with("20"));
    }
}
