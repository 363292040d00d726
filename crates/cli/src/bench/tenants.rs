//! `tiermem bench tenants --json DIR`: processes sharing one GPU, with static caps and with
//! tiermemd (issue 13; GDM §6, GPrioSwap §4). Every tenant is a process of its own
//! (`tenant_worker.rs`) whose GPU kernels check every byte every round.
//!
//! * **Throughput**: three jobs of different lengths (rounds R, 2R, 3R over a working set of
//!   0.6× the node's cap each) run together, each with a static third of the cap
//!   (`throughput_static`) and under tiermemd sharing the whole cap (`throughput_tiermemd`), and
//!   one after another with the whole cap each (`throughput_serial`), and under tiermemd
//!   sharing whole working sets in turns (`hbm_sharing = "working-sets"`, opt-in:
//!   `throughput_working_sets`). Bytes worked on ÷ the
//!   wall time of the whole set (process start included, the same for every mode); each mode
//!   runs `--repeats` times (5), alternating, and counts by its median (tenants_throughput.rs). With static
//!   caps the memory of a job that has finished stays idle; with tiermemd the jobs still
//!   running take it. Each job spends `think_ms` of host time before each buffer's kernels, as
//!   real jobs do between kernels, so one job alone leaves the GPU partly idle.
//! * **Hog**: two jobs that each fit in a third of the cap, with and without a third asking for
//!   3× the cap (`hog_victim_speed`: their speed with it ÷ without, over runs of 6R rounds,
//!   the hog already holding the GPU when they start; alone and beside it in turn, `--repeats`
//!   times, the median counted, every ratio in `…_runs`; `…_costart`: the hog started with them;
//!   `hog_victim_round_speed`: their median rounds then, once the budgets settled).
//!   **Leak**: two jobs beside one that allocates without freeing (`leak_victims_finished`).
//!   **Idle**: a job beside one that works a round over 0.6× the cap and then acquires nothing
//!   (`idle_lender_others_speed`: the job's rounds once the other is idle, median, against
//!   its rounds alone on the node; the daemon here counts a tenant idle after
//!   `--idle-after-ms`, 500 by default).
//! * **Fair share**: two equal tenants; `settle_ms` from the daemon's first sight of the second
//!   until both budgets are, and stay, within 5% of half the cap; `fair_share_error` the
//!   largest deviation over the last of three seconds.
//! * `overhead_alone`: one job under tiermemd ÷ the same job standalone with the whole cap (in
//!   turn, `--repeats` times, the median counted; every ratio in `…_runs`).
//!   `pairs_finished`: GDM's test, pairs of jobs that together need more than the cap, run
//!   together under tiermemd. `reclaim_ms_per_GiB`: an engine meeting a halved budget, its room
//!   to evict into pinned ahead as a linked tenant's is (`…_pinning`: pinned as the cut needs it).

#[path = "tenants_throughput.rs"]
mod throughput;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use tiermem::{Access, AllocOptions, Engine, EngineConfig, Region, StreamHandle};
use tiermem_protocol::Tier;

pub struct Setup {
    pub cap: usize,
    pub buffer: usize,
    pub rounds: u64,
    /// Host time per buffer's turn in every job (`tenant_worker.rs`).
    pub think_ms: f64,
    /// The daemon's `idle_after_ms` (0: never idle).
    pub idle_after_ms: u64,
    /// The daemon's `ramp_ms` (0: newcomers lend at once).
    pub ramp_ms: u64,
    /// Only the throughput sets.
    pub throughput_only: bool,
    /// A folder to keep the daemons' logs in.
    pub logs: Option<PathBuf>,
    /// Runs of each throughput set (tenants_throughput.rs).
    pub repeats: usize,
}

/// A job: its working set, rounds (0: until stopped), leak limit, and the rounds after which
/// it acquires nothing more.
#[derive(Clone, Default)]
struct Job {
    working_set: usize,
    rounds: u64,
    leak: Option<usize>,
    idle_after: Option<u64>,
}

/// How the jobs of a set run: each with a static cap, or under the daemon on `socket`.
#[derive(Clone)]
enum Mode {
    Static(usize),
    Daemon(PathBuf),
}

#[derive(Debug, Clone, Default)]
struct Outcome {
    bytes: f64,
    seconds: f64,
    ok: bool,
    /// Bytes the job's engine copied in from the host (the work its budget cost).
    paged_in: f64,
    /// Per round, at its end: seconds since the job's work began, its HBM budget, bytes paged
    /// in so far and more (the detail's `rounds_columns` names them: `tenant_worker::round_end`).
    rounds: serde_json::Value,
    /// Whether its paging ran ahead of its acquires: chunks paged in and of them prefetched,
    /// milliseconds its acquires waited for page-ins and for evictions.
    paging: serde_json::Value,
}

impl Outcome {
    fn speed(&self) -> f64 {
        self.bytes / self.seconds.max(1e-9)
    }

    /// The median time of its rounds from the `from`-th on (each round's end is traced).
    fn median_round_s(&self, from: usize) -> f64 {
        let ends: Vec<f64> = self.rounds.as_array().into_iter().flatten().filter_map(|r| r[0].as_f64()).collect();
        let mut times: Vec<f64> = ends.windows(2).map(|w| w[1] - w[0]).skip(from.saturating_sub(1)).collect();
        times.sort_by(f64::total_cmp);
        times.get(times.len() / 2).copied().unwrap_or(f64::NAN)
    }
}

struct Daemon {
    child: Child,
    socket: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The daemon sharing `cap` with `hbm_sharing = sharing` ("fair" or "working-sets").
fn spawn_daemon(dir: &Path, cap: usize, setup: &Setup, sharing: &str) -> Result<Daemon, String> {
    let config = dir.join("tiermemd.toml");
    let socket = dir.join("tiermemd.sock");
    let _ = std::fs::remove_file(&socket);
    let (idle_after_ms, ramp_ms) = (setup.idle_after_ms, setup.ramp_ms);
    let text = format!(
        "deadline_ms = 2000\nidle_after_ms = {idle_after_ms}\nramp_ms = {ramp_ms}\nhbm_sharing = \"{sharing}\"\n\n\
         [[gpu]]\nindex = 0\nhbm = \"{}MiB\"\n",
        cap >> 20
    );
    std::fs::write(&config, text).map_err(|e| format!("bench tenants: write {}: {e}", config.display()))?;
    let log = match &setup.logs {
        Some(folder) => {
            std::fs::create_dir_all(folder).map_err(|e| format!("bench tenants: create {}: {e}", folder.display()))?;
            let path = folder.join(format!("tenants-daemon-{sharing}.log"));
            let file = std::fs::OpenOptions::new().create(true).append(true).open(&path);
            Stdio::from(file.map_err(|e| format!("bench tenants: open {}: {e}", path.display()))?)
        }
        None => Stdio::null(),
    };
    let child = crate::own_program()?
        .args(["daemon", "--config"])
        .arg(&config)
        .arg("--socket")
        .arg(&socket)
        .stderr(log)
        .spawn()
        .map_err(|e| format!("bench tenants: start tiermem daemon: {e}"))?;
    let daemon = Daemon { child, socket };
    let until = Instant::now() + Duration::from_secs(30);
    while tiermem_tenant::query_status(&daemon.socket).is_err() {
        if Instant::now() > until {
            return Err("bench tenants: the daemon did not answer within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(daemon)
}

fn spawn_job(setup: &Setup, job: &Job, mode: &Mode, stop: &Path) -> Result<Child, String> {
    let mut command = crate::own_program()?;
    command.args(["bench", "tenant-worker", "--working-set", &job.working_set.to_string()]);
    command.args(["--buffer-size", &setup.buffer.to_string(), "--rounds", &job.rounds.to_string()]);
    command.args(["--think-ms", &setup.think_ms.to_string()]);
    command.arg("--stop-file").arg(stop);
    if let Some(limit) = job.leak {
        command.args(["--leak", &limit.to_string()]);
    }
    if let Some(rounds) = job.idle_after {
        command.args(["--idle-after-rounds", &rounds.to_string()]);
    }
    // A simulated device as large as the node's cap (ignored on a GPU).
    command.env("TIERMEM_SIM_HBM", setup.cap.to_string());
    match mode {
        Mode::Static(cap) => command.env("TIERMEM_DAEMON", "off").env("TIERMEM_HBM_LIMIT", cap.to_string()),
        Mode::Daemon(socket) => command.env("TIERMEM_DAEMON", socket).env_remove("TIERMEM_HBM_LIMIT"),
    };
    command.stdout(Stdio::piped()).spawn().map_err(|e| format!("bench tenants: start a tenant: {e}"))
}

fn outcome(child: Child) -> Outcome {
    let Ok(output) = child.wait_with_output() else { return Outcome::default() };
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text.lines().rev().find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok());
    let field = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    match line {
        Some(v) => Outcome {
            bytes: field(&v, "bytes"),
            seconds: field(&v, "seconds"),
            paged_in: field(&v, "paged_in_bytes"),
            rounds: v["rounds_trace"].clone(),
            paging: serde_json::json!({
                "page_ins": v["page_ins"], "prefetched": v["prefetched"],
                "stall_ms": v["stall_ms"], "evict_wait_ms": v["evict_wait_ms"],
            }),
            ok: output.status.success() && v["mismatched_words"].as_u64() == Some(0),
        },
        None => Outcome::default(),
    }
}

/// Runs `jobs` together; jobs with no rounds run until the others have finished. Returns
/// each job's outcome and the wall time until the last bounded job finished.
fn run_set(setup: &Setup, dir: &Path, jobs: &[Job], mode: &Mode) -> Result<(Vec<Outcome>, f64), String> {
    let stop = dir.join("stop");
    let _ = std::fs::remove_file(&stop);
    let started = Instant::now();
    let children = jobs.iter().map(|job| spawn_job(setup, job, mode, &stop)).collect::<Result<Vec<_>, _>>()?;
    let (bounded, endless): (Vec<_>, Vec<_>) = children.into_iter().zip(jobs).partition(|(_, job)| job.rounds > 0);
    let bounded: Vec<Outcome> = bounded.into_iter().map(|(child, _)| outcome(child)).collect();
    let wall = started.elapsed().as_secs_f64();
    std::fs::write(&stop, b"").map_err(|e| e.to_string())?;
    let endless: Vec<Outcome> = endless.into_iter().map(|(child, _)| outcome(child)).collect();
    Ok((bounded.into_iter().chain(endless).collect(), wall))
}

/// Runs `jobs` as [`run_set`] does, beside `running` (a job without rounds) started first and
/// given up to 10 s to fill its budget; `running` stops with them. Returns the jobs' outcomes,
/// then its own.
fn run_beside(setup: &Setup, dir: &Path, running: &Job, jobs: &[Job], socket: &Path) -> Result<Vec<Outcome>, String> {
    let stop = dir.join("stop");
    let _ = std::fs::remove_file(&stop);
    let first = spawn_job(setup, running, &Mode::Daemon(socket.to_owned()), &stop)?;
    let until = Instant::now() + Duration::from_secs(10);
    let filled = |r: &tiermem_protocol::StatusReport| {
        r.pools.iter().filter(|p| p.tier == Tier::Hbm).flat_map(|p| &p.shares).any(|s| s.used * 10 >= s.budget * 9)
    };
    while Instant::now() < until && !tiermem_tenant::query_status(socket).is_ok_and(|r| filled(&r)) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let (mut outcomes, _) = run_set(setup, dir, jobs, &Mode::Daemon(socket.to_owned()))?;
    outcomes.push(outcome(first));
    Ok(outcomes)
}

fn hbm_budgets(socket: &Path) -> Vec<u64> {
    let Ok(report) = tiermem_tenant::query_status(socket) else { return Vec::new() };
    report.pools.iter().filter(|p| p.tier == Tier::Hbm).flat_map(|p| p.shares.iter().map(|s| s.budget)).collect()
}

/// Two equal tenants, watched for three seconds from the daemon's first sight of the second:
/// (ms from then until both budgets are, and stay, within 5% of half the cap; the largest
/// deviation from half the cap over the last second, as a fraction of it). The second
/// tenant's process start (the CUDA context, its first allocations) is not counted.
fn fair_share(setup: &Setup, dir: &Path) -> Result<(f64, f64), String> {
    let daemon = spawn_daemon(dir, setup.cap, setup, "fair")?;
    let stop = dir.join("stop");
    let _ = std::fs::remove_file(&stop);
    let job = Job { working_set: setup.cap * 6 / 10, ..Job::default() };
    let mode = Mode::Daemon(daemon.socket.clone());
    let first = spawn_job(setup, &job, &mode, &stop)?;
    let until = Instant::now() + Duration::from_secs(60);
    while hbm_budgets(&daemon.socket).is_empty() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    let second = spawn_job(setup, &job, &mode, &stop)?;
    while hbm_budgets(&daemon.socket).len() < 2 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    let started = Instant::now();
    let half = setup.cap as f64 / 2.0;
    let mut samples: Vec<(f64, f64)> = Vec::new(); // (ms since the second registered, deviation)
    while started.elapsed() < Duration::from_secs(3) {
        let budgets = hbm_budgets(&daemon.socket);
        let deviation = match budgets.len() {
            2 => budgets.iter().map(|&x| (x as f64 - half).abs() / half).fold(0.0, f64::max),
            _ => 1.0, // a tenant gone: counted as unsettled
        };
        samples.push((started.elapsed().as_secs_f64() * 1e3, deviation));
        std::thread::sleep(Duration::from_millis(5));
    }
    std::fs::write(&stop, b"").map_err(|e| e.to_string())?;
    let ok = outcome(first).ok & outcome(second).ok;
    let settle =
        samples.iter().rposition(|&(_, d)| d > 0.05).map_or(0.0, |i| samples.get(i + 1).map_or(f64::NAN, |s| s.0));
    let last_second = samples.iter().filter(|&&(ms, _)| ms >= 2000.0).map(|&(_, d)| d).fold(0.0, f64::max);
    match (settle.is_nan(), ok) {
        (false, true) => Ok((settle, last_second)),
        (true, _) => Err("bench tenants: two equal tenants were not within 5% of equal shares at the end".into()),
        (_, false) => Err("bench tenants: a fair-share tenant failed or lost bytes".into()),
    }
}

/// Milliseconds per GiB for an engine to meet a halved budget (its working set dirty in HBM,
/// never evicted before). `room_ahead`: with its room to evict into pinned first, as a tenant's
/// daemon link does while it runs (evict_room.rs); otherwise pinned as the cut needs it.
fn reclaim_ms_per_gib(setup: &Setup, room_ahead: bool) -> Result<f64, String> {
    let config = EngineConfig {
        hbm_limit: Some(setup.cap),
        sim_hbm: setup.cap,
        evict_room: room_ahead,
        ..EngineConfig::from_env().map_err(|e| e.to_string())?
    };
    let engine = Engine::new(config).map_err(|e| e.to_string())?;
    let size = setup.cap * 8 / 10;
    let (id, _) = engine.alloc(size, AllocOptions::default()).map_err(|e| e.to_string())?;
    let stream = StreamHandle(0);
    engine.acquire(&[Region::whole(id)], Access::ReadWrite, stream).map_err(|e| e.to_string())?;
    engine.release(&[Region::whole(id)], stream).map_err(|e| e.to_string())?;
    engine.device().synchronize_stream(stream).map_err(|e| e.to_string())?;
    while engine.pin_room_to_evict().map_err(|e| e.to_string())? > 0 {}
    let before = engine.stats().tiers[Tier::Hbm].used_bytes;
    let started = Instant::now();
    let ticket = engine.set_hbm_budget(setup.cap / 2).map_err(|e| e.to_string())?;
    engine.finish(ticket).map_err(|e| e.to_string())?;
    let ms = started.elapsed().as_secs_f64() * 1e3;
    let shed = before.saturating_sub(engine.stats().tiers[Tier::Hbm].used_bytes) as f64 / (1u64 << 30) as f64;
    engine.free(id).map_err(|e| e.to_string())?;
    Ok(ms / shed.max(1e-9))
}

pub fn run(dir: &Path, commit: &str, setup: Setup) -> Result<(), String> {
    let scratch = std::env::temp_dir().join(format!("tiermem-bench-tenants-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(|e| e.to_string())?;
    let result = measure(dir, commit, &setup, &scratch);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn measure(dir: &Path, commit: &str, setup: &Setup, scratch: &Path) -> Result<(), String> {
    let (cap, r) = (setup.cap, setup.rounds);
    let info = Engine::new(EngineConfig {
        hbm_limit: Some(setup.buffer * 2),
        sim_hbm: cap,
        ..EngineConfig::from_env().map_err(|e| e.to_string())?
    })
    .map_err(|e| e.to_string())?
    .device_info()
    .clone();
    println!("tenants on {} under a node cap of {} MiB, buffers of {} MiB", info.name, cap >> 20, setup.buffer >> 20);
    let job = |share: usize, rounds: u64| Job { working_set: cap * share / 10, rounds, ..Job::default() };
    let set = [job(6, r), job(6, 2 * r), job(6, 3 * r)];
    let all_ok = |o: &[Outcome]| o.iter().all(|o| o.ok);
    let mut verified = true;

    let sets = throughput::measure(setup, scratch, &set)?;
    let (stat, turns, fair, serial) = (&sets.static_thirds, &sets.working_sets, &sets.fair, &sets.serial);
    let (throughput_static, throughput_tiermemd) = (stat.throughput(), fair.throughput());
    let (throughput_serial, throughput_working_sets) = (serial.throughput(), turns.throughput());
    println!(
        "medians of {} repeats: static thirds {throughput_static:.2} GB/s, tiermemd {throughput_tiermemd:.2}, \
         working sets in turns {throughput_working_sets:.2}, serial {throughput_serial:.2}",
        setup.repeats
    );
    verified &= sets.all_ok();
    let mut metrics = serde_json::json!({
        "node_cap_bytes": cap, "working_set_bytes": cap * 6 / 10, "buffer_bytes": setup.buffer, "rounds_unit": r,
        "think_ms_per_buffer": setup.think_ms, "repeats": setup.repeats,
        "wall_static_s": stat.wall(), "wall_tiermemd_s": fair.wall(),
        "wall_serial_s": serial.wall(), "wall_working_sets_s": turns.wall(),
        "throughput_static_GBps": throughput_static, "throughput_tiermemd_GBps": throughput_tiermemd,
        "throughput_serial_GBps": throughput_serial, "throughput_working_sets_GBps": throughput_working_sets,
        "throughput_static_GBps_runs": stat.throughputs(), "throughput_tiermemd_GBps_runs": fair.throughputs(),
        "throughput_serial_GBps_runs": serial.throughputs(),
        "throughput_working_sets_GBps_runs": turns.throughputs(),
        "idle_after_ms": setup.idle_after_ms, "ramp_ms": setup.ramp_ms,
    });
    let ratios = serde_json::json!({
        "vs_static": throughput_tiermemd / throughput_static,
        "vs_serial": throughput_tiermemd / throughput_serial,
        "working_sets_vs_static": throughput_working_sets / throughput_static,
        "working_sets_vs_serial": throughput_working_sets / throughput_serial,
    });
    let mut detail = serde_json::json!({
        "static": stat.detail(), "tiermemd": fair.detail(), "working_sets": turns.detail(), "serial": serial.detail(),
        "rounds_columns": super::tenant_worker::ROUND_COLUMNS,
    });
    if setup.throughput_only {
        return finish(dir, commit, &info, metrics, ratios, detail, verified);
    }
    let daemon = spawn_daemon(scratch, cap, setup, "fair")?;
    let shared = Mode::Daemon(daemon.socket.clone());

    // Two tenants that each fit in a third of the cap, beside one asking for 3× the cap.
    // Runs of 6R rounds. With the hog already running (holding the GPU) when they start
    // (`hog_victim_speed`), and started with them (`…_costart`: the first round, in which the
    // budgets settle and the victims page in what the hog's start pushed out, costs them).
    // Alone and beside the hog in turn, `--repeats` times: the median of the ratios counts.
    let victims = [job(3, 6 * r), job(3, 6 * r)];
    let hog = Job { working_set: 3 * cap, ..Job::default() };
    let speed_ratio = |alone: &[Outcome], with: &[Outcome]| {
        (with[0].speed() / alone[0].speed()).min(with[1].speed() / alone[1].speed())
    };
    let (mut alone, mut with_hog, mut hog_runs) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..setup.repeats.max(1) {
        alone = run_set(setup, scratch, &victims, &shared)?.0;
        with_hog = run_beside(setup, scratch, &hog, &victims, &daemon.socket)?;
        verified &= all_ok(&alone) && all_ok(&with_hog);
        hog_runs.push(speed_ratio(&alone, &with_hog));
    }
    let hog_victim_speed = super::median(hog_runs.clone());
    let (costart, _) = run_set(setup, scratch, &[victims[0].clone(), victims[1].clone(), hog], &shared)?;
    let hog_victim_speed_costart = speed_ratio(&alone, &costart);
    let round_ratio = |i: usize| alone[i].median_round_s(2) / costart[i].median_round_s(2);
    let hog_victim_round_speed = round_ratio(0).min(round_ratio(1));
    println!(
        "hog: the others at {hog_victim_speed:.2} of their speed without it; started with it {hog_victim_speed_costart:.2} \
         ({hog_victim_round_speed:.2} once settled)"
    );
    let leaker = Job { working_set: cap / 10, leak: Some(2 * cap), ..Job::default() };
    let (with_leak, _) = run_set(setup, scratch, &[victims[0].clone(), victims[1].clone(), leaker], &shared)?;
    let leak_victims_finished = with_leak[0].ok && with_leak[1].ok;
    println!("leak: the others finished with every byte: {leak_victims_finished}");
    verified &= all_ok(&costart) && all_ok(&with_leak);

    // One job under the daemon and standalone in turn, `--repeats` times, by the median.
    let one = [job(6, 2 * r)];
    let mut overhead_runs = Vec::new();
    for _ in 0..setup.repeats.max(1) {
        let (under_daemon, _) = run_set(setup, scratch, &one, &shared)?;
        let (standalone, _) = run_set(setup, scratch, &one, &Mode::Static(cap))?;
        verified &= all_ok(&under_daemon) && all_ok(&standalone);
        overhead_runs.push(under_daemon[0].seconds / standalone[0].seconds.max(1e-9));
    }
    let overhead_alone = super::median(overhead_runs.clone());
    // Beside a tenant gone idle after one round: the job's later rounds against its rounds alone.
    let idler = Job { working_set: cap * 6 / 10, idle_after: Some(1), ..Job::default() };
    let busy = job(6, 6 * r);
    let (with_idler, _) = run_set(setup, scratch, &[busy.clone(), idler], &shared)?;
    let (busy_alone, _) = run_set(setup, scratch, &[busy], &shared)?;
    let later = (3 * r) as usize;
    let idle_lender_others_speed = busy_alone[0].median_round_s(later) / with_idler[0].median_round_s(later);
    println!("idle: a job beside an idle tenant at {idle_lender_others_speed:.2} of its speed alone");
    verified &= all_ok(&with_idler) && all_ok(&busy_alone);
    let mut pairs_finished = 0;
    let pair_shares = [6, 7, 8];
    for share in pair_shares {
        let (pair, _) = run_set(setup, scratch, &[job(share, r), job(share, r)], &shared)?;
        pairs_finished += usize::from(all_ok(&pair));
    }
    println!("overhead alone {overhead_alone:.3}; pairs finished {pairs_finished} of {}", pair_shares.len());
    drop(daemon);

    let (settle_ms, fair_share_error) = fair_share(setup, scratch)?;
    println!("fair share: settled in {settle_ms:.0} ms, then within {:.1}%", fair_share_error * 100.0);
    let reclaim_pinning = reclaim_ms_per_gib(setup, false)?;
    let reclaim = reclaim_ms_per_gib(setup, true)?;
    println!("reclaim: {reclaim:.1} ms per GiB with its room pinned ahead, {reclaim_pinning:.1} pinning it");

    let more = serde_json::json!({
        "hog_victim_speed": hog_victim_speed, "hog_victim_speed_runs": hog_runs,
        "overhead_alone_runs": overhead_runs,
        "hog_victim_round_speed": hog_victim_round_speed, "hog_victim_speed_costart": hog_victim_speed_costart,
        "leak_victims_finished": leak_victims_finished, "fair_share_error": fair_share_error,
        "settle_ms": settle_ms, "reclaim_ms_per_GiB": reclaim, "reclaim_ms_per_GiB_pinning": reclaim_pinning, "overhead_alone": overhead_alone,
        "pairs_finished": pairs_finished, "pairs": pair_shares.len(),
        "idle_lender_others_speed": idle_lender_others_speed,
    });
    // The victims' runs alone and beside the hog: the last repeat's.
    let more_detail = serde_json::json!({
        "victims_alone": speeds(&alone),
        "victims_with_hog": speeds(&with_hog), "victims_started_with_hog": speeds(&costart),
        "victims_with_leak": speeds(&with_leak),
        "beside_an_idle_tenant": speeds(&with_idler), "alone_for_idle": speeds(&busy_alone),
    });
    for (into, from) in [(&mut metrics, more), (&mut detail, more_detail)] {
        if let (Some(into), serde_json::Value::Object(from)) = (into.as_object_mut(), from) {
            into.extend(from);
        }
    }
    finish(dir, commit, &info, metrics, ratios, detail, verified && leak_victims_finished)
}

/// Each job's outcome for the detail JSON.
fn speeds(outcomes: &[Outcome]) -> Vec<serde_json::Value> {
    let json = |o: &Outcome| serde_json::json!({"bytes": o.bytes, "seconds": o.seconds, "paged_in": o.paged_in, "ok": o.ok, "paging": o.paging, "rounds": o.rounds});
    outcomes.iter().map(json).collect()
}

/// Writes the report and its detail; an error when a tenant failed or a byte differed.
fn finish(
    dir: &Path,
    commit: &str,
    info: &tiermem::mechanism::DeviceInfo,
    metrics: serde_json::Value,
    ratios: serde_json::Value,
    detail: serde_json::Value,
    verified: bool,
) -> Result<(), String> {
    let date = super::today();
    let report = super::report("tenants", commit, &date, info, metrics, ratios, verified);
    super::write_report(dir, "tenants", &date, commit, &report, &detail)?;
    if !verified {
        return Err("bench tenants: a tenant failed or a byte differed (see the detail JSON)".into());
    }
    Ok(())
}
