//! `tiermem soak`: tells a user that tiermem keeps every byte on this machine, as `fio
//! --verify` or memtest do for disks and RAM.
//!
//! Several threads, each with its own stream and buffers, plus buffers all of them share, run
//! random operations for a while over small caps, so chunks move between HBM, the host tier
//! and the file tier all the time: kernels that write and check patterns through the buffers'
//! device addresses (the pattern kernels, `Device::fill_pattern_async`), host writes and
//! reads, prefetches, page-outs and page-ins (blocking and started-then-finished), exchanges,
//! discards (a discarded block must read as zeros or as it was, until written),
//! page-outs to the file, frees and new allocations (some as consecutive parts), steps of a
//! recorded schedule (`pass_begins`, `step_enters`: paging ahead, Belady), HBM budgets changed
//! as the node daemon changes them and idle HBM given back. Every buffer's contents are known: each
//! 64 KiB block holds the pattern of a seed the soak remembers, so every read and every
//! check kernel verifies every byte it covers. Running out of memory under these caps is
//! expected and counted; any other error is unexpected.
//!
//! At the end every buffer is checked whole and freed, the engine dropped, and what the soak
//! started with is compared with what is left: open files, the device's free memory (whole
//! chunks), the engine's own tiers, and on the simulated device everything it handed out.
//! Any mismatch, unexpected error or leak makes the exit code non-zero.

mod model;
mod worker;

use crate::bench;
use model::Tally;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiermem::mechanism::counting::CountingDevice;
use tiermem::mechanism::sim::{SimDevice, SimLive, Timing};
use tiermem::mechanism::{BackendKind, Device};
use tiermem::Tier;
use tiermem::{format_size, parse_size, Engine, EngineConfig};

#[derive(clap::Args)]
pub struct SoakArgs {
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 60.0)]
    seconds: f64,
    /// Threads, each with its own stream and buffers (all of them also share a few buffers).
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// The file tier's file (default: one in the temporary directory). It must allow O_DIRECT.
    #[arg(long)]
    file: Option<PathBuf>,
    /// Run without a file tier.
    #[arg(long, conflicts_with = "file")]
    no_file: bool,
    /// HBM cap (default: 256MiB on a GPU, 32MiB on the simulated device); kept small so data moves.
    #[arg(long, value_parser = parse_size)]
    hbm_limit: Option<usize>,
    /// Seed of the random operations (the same seed makes the same choices).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Folder to write soak-<yyyymmdd>-<shortsha>.json into.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Commit being tested, for the JSON (default: $TIERMEM_COMMIT, else the commit this binary was built from).
    #[arg(long)]
    commit: Option<String>,
}

pub fn run(args: SoakArgs) -> Result<(), String> {
    let env = EngineConfig::from_env().map_err(|e| format!("soak: {e}"))?;
    let chunk = 2 << 20;
    let (probe, fallback) =
        tiermem::mechanism::open(env.backend, env.device, 64 << 20).map_err(|e| format!("soak: {e}"))?;
    if let Some(why) = fallback {
        println!("No GPU: {why}");
    }
    let simulated = probe.info().backend == BackendKind::Sim;
    let hbm = args.hbm_limit.or(env.hbm_limit).unwrap_or(if simulated { 32 << 20 } else { 256 << 20 });
    let hbm_chunks = (hbm / chunk).max(4);
    // On the simulated device, work completes late and in random order (Timing::Random); with
    // TIERMEM_SIM_GPUS above 1 the device is GPU 0 of a node whose other GPUs lend their HBM
    // to the peer tier, a fourth tier for the chunks to move through.
    let sim = match simulated {
        true => {
            let node = SimDevice::node(env.sim_gpus.max(1), (hbm_chunks + 16) * chunk);
            Some(Arc::new(node.map_err(|e| format!("soak: {e}"))?.swap_remove(0)))
        }
        false => None,
    };
    if let Some(sim) = &sim {
        sim.set_timing(Timing::Random);
        sim.set_seed(args.seed);
    }
    let device: Arc<dyn Device> = match &sim {
        Some(sim) => sim.clone(),
        None => probe,
    };
    if simulated {
        println!("Running on the SIMULATED device: this checks tiermem's logic on this machine, not the GPU.");
    }
    let file = match (&args.file, args.no_file) {
        (_, true) => None,
        (Some(path), false) => Some(path.clone()),
        (None, false) => Some(std::env::temp_dir().join(format!("tiermem-soak-{}", std::process::id()))),
    };
    let config = EngineConfig {
        hbm_limit: Some(hbm_chunks * chunk),
        host_limit: Some(hbm_chunks * chunk),
        file: file.clone(),
        file_limit: 4 * hbm_chunks * chunk,
        batch_chunks: 4,
        ..env
    };
    warm_up(&device, &config, args.threads.max(1)).map_err(|e| format!("soak: warming up the device: {e}"))?;
    let before = Resources::measure(device.as_ref(), sim.as_deref());
    // Everything the soak and its engine take from the device is counted from here on.
    let counting = Arc::new(CountingDevice::new(Arc::clone(&device)));
    let engine = Engine::with_device(counting.clone(), &config).map_err(|e| format!("soak: {e}"))?;
    let threads = args.threads.max(1);
    let lent = engine.stats().tiers.get(Tier::Peer).map_or(0, |peer| peer.capacity_bytes);
    println!(
        "soak: {} | HBM cap {} | host tier {} | file tier {} | peer tier {} | {threads} threads | {:.0} s | seed {}",
        device.info().name,
        format_size(hbm_chunks * chunk),
        format_size(hbm_chunks * chunk),
        file.as_ref().map_or("none".into(), |p| format!("{} at {}", format_size(4 * hbm_chunks * chunk), p.display())),
        if lent > 0 { format_size(lent) } else { "none".into() },
        args.seconds,
        args.seed
    );

    let tally = Tally::default();
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(args.seconds.max(0.0));
    let stop = AtomicBool::new(false);
    let plan = worker::Plan::new(hbm_chunks, chunk, threads, file.is_some());
    let shared = worker::SharedBuffers::new(&engine, &plan, args.seed)?;
    // The most chunks each tier held at once, sampled as progress is: a soak that never
    // reached a tier says so.
    let mut peaks: BTreeMap<Tier, usize> = BTreeMap::new();
    std::thread::scope(|scope| -> Result<(), String> {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (engine, shared, tally, stop, plan) = (&engine, &shared, &tally, &stop, &plan);
                let seed = args.seed.wrapping_mul(1000).wrapping_add(t as u64);
                scope.spawn(move || worker::Worker::new(engine, shared, tally, plan, seed).run(stop))
            })
            .collect();
        while Instant::now() < deadline && !workers.iter().all(|w| w.is_finished()) {
            std::thread::sleep(Duration::from_millis(250).min(deadline.saturating_duration_since(Instant::now())));
            for (tier, used) in engine.stats().tiers.iter() {
                let peak = peaks.entry(tier).or_default();
                *peak = (*peak).max(used.used_bytes / chunk);
            }
            if started.elapsed().as_millis() % 1000 < 250 {
                println!("{}", tally.progress(started.elapsed().as_secs_f64()));
            }
        }
        stop.store(true, Ordering::Relaxed);
        for worker in workers {
            worker.join().map_err(|_| "soak: a worker thread panicked (a bug in tiermem's soak)".to_string())?;
        }
        Ok(())
    })?;
    shared.check_and_free(&engine, &tally);
    let seconds = started.elapsed().as_secs_f64();
    let stats = engine.stats();
    let file_tier_ops = stats.transfers.file_reads + stats.transfers.file_writes;
    if lent > 0 {
        let t = &stats.transfers;
        println!(
            "peer tier: {} chunks mapped in place, {} in-place reads, {} page-ins through a neighbour's link",
            t.in_place_maps, t.in_place_reads, t.by_neighbours
        );
    }
    let held_at_most: Vec<String> = peaks.iter().map(|(tier, chunks)| format!("{tier} {chunks}")).collect();
    println!("chunks held at most, per tier: {}", held_at_most.join(", "));
    let mut leaks = Vec::new();
    let in_use = [("HBM", stats.tiers[Tier::Hbm].chunks), ("host tier", stats.tiers[Tier::Host].used_bytes / chunk)];
    let below = [(Tier::File, "file tier"), (Tier::Peer, "peer tier")];
    let below = below.into_iter().filter_map(|(tier, name)| Some((name, stats.tiers.get(tier)?.used_bytes / chunk)));
    for (tier, chunks) in in_use.into_iter().chain(below) {
        if chunks > 0 {
            leaks.push(format!("{tier}: {chunks} chunks still in use after every buffer was freed"));
        }
    }
    drop(engine);
    let held = counting.held();
    if !held.is_empty() {
        leaks.push(format!("driver objects not given back: {held:?}"));
    }
    leaks.extend(before.leaks_since(device.as_ref(), sim.as_deref()));
    let device_free_change = before.device_free_change(device.as_ref());
    if let Some(path) = file.as_ref().filter(|p| p.exists()) {
        leaks.push(format!("the file tier's file {} outlived the engine", path.display()));
    }

    let summary = tally.summary(seconds, threads, file_tier_ops, leaks.len());
    println!("\n{}", tally.progress(seconds));
    for leak in &leaks {
        println!("LEAK: {leak}");
    }
    let passed = summary.passed();
    println!(
        "soak {}: {} ops in {seconds:.1} s ({} GPU kernels, {file_tier_ops} chunk transfers to or from the file), {} mismatches, {} unexpected errors, {} leaks",
        if passed { "PASSED" } else { "FAILED" },
        summary.ops,
        summary.gpu_kernel_ops,
        summary.mismatches,
        summary.unexpected_errors,
        leaks.len()
    );
    if let Some(dir) = &args.json {
        let commit = crate::bench::measured_commit(args.commit.clone());
        let date = bench::today();
        let metrics = serde_json::to_value(&summary).map_err(|e| e.to_string())?;
        let report = bench::report("soak", &commit, &date, device.info(), metrics, serde_json::json!({}), passed);
        let detail = serde_json::json!({
            "config": { "hbm_limit": hbm_chunks * chunk, "host_limit": hbm_chunks * chunk, "file_limit": file.as_ref().map(|_| 4 * hbm_chunks * chunk), "threads": threads, "seed": args.seed, "simulated": simulated },
            "ops_by_kind": tally.by_kind(),
            "chunks_held_at_most": peaks.iter().map(|(tier, chunks)| (tier.name(), *chunks)).collect::<BTreeMap<_, _>>(),
            "first_failures": tally.failures(),
            "leaks": leaks,
            "driver_objects_held_at_end": held,
            "device_free_bytes_change": device_free_change,
        });
        bench::write_report(dir, "soak", &date, &commit, &report, &detail)?;
    }
    if passed {
        Ok(())
    } else {
        Err(format!("soak failed: {}", tally.failures().first().cloned().unwrap_or_else(|| "leaks, above".into())))
    }
}

/// Does once, before the "before" measurement, what the soak does outside its engine (loads
/// the kernels, creates the threads' streams, launches on them) and one short engine's life
/// (a buffer written, paged out and in, freed). The driver keeps memory for loaded modules,
/// launch resources and its own VMM bookkeeping for the context's life; that is not the
/// engine's to give back, and a leak of the engine's own shows again in the soak's engine.
fn warm_up(device: &Arc<dyn Device>, config: &EngineConfig, threads: usize) -> Result<(), String> {
    let text = |e: tiermem::mechanism::DeviceError| e.to_string();
    let scratch = device.alloc_plain(1 << 20).map_err(text)?;
    let streams = (0..threads)
        .map(|_| device.create_stream(tiermem::mechanism::StreamPriority::High))
        .collect::<Result<Vec<_>, _>>()
        .map_err(text)?;
    for &stream in &streams {
        device.fill_pattern_async(scratch + 8, 1000, 1, 0, stream).map_err(text)?;
        device.check_pattern_async(scratch + 8, 1000, 1, 0, scratch, stream).map_err(text)?;
        device.synchronize_stream(stream).map_err(text)?;
    }
    for stream in streams {
        device.destroy_stream(stream).map_err(text)?;
    }
    device.free_plain(scratch).map_err(text)?;
    let engine = Engine::with_device(Arc::clone(device), &EngineConfig { file: None, ..config.clone() })
        .map_err(|e| e.to_string())?;
    let size = 4 * device.info().granularity;
    let (id, _) = engine.alloc(size, tiermem::AllocOptions::default()).map_err(|e| e.to_string())?;
    engine.write(id, 0, &vec![7u8; size]).map_err(|e| e.to_string())?;
    engine.page_out(tiermem::Target::Buffer(id)).map_err(|e| e.to_string())?;
    engine.page_in(tiermem::Target::Buffer(id)).map_err(|e| e.to_string())?;
    engine.free(id).map_err(|e| e.to_string())
}

/// What the process holds that the engine must give back.
struct Resources {
    fds: usize,
    device_free: Option<usize>,
    sim: Option<SimLive>,
}

impl Resources {
    fn measure(device: &dyn Device, sim: Option<&SimDevice>) -> Self {
        let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
        let device_free = match device.info().backend {
            BackendKind::Cuda => device.mem_info().ok().map(|(free, _)| free),
            BackendKind::Sim => None,
        };
        Self { fds, device_free, sim: sim.map(SimDevice::live) }
    }

    /// How the driver's free device memory changed since: reported, not counted as a leak,
    /// because the driver keeps pools of its own (events, streams) for the context's life: on
    /// the H200 it ended 2 MiB lower after a million operations whose every driver object was
    /// given back (`CountingDevice`).
    fn device_free_change(&self, device: &dyn Device) -> Option<i64> {
        let now = Self::measure(device, None).device_free?;
        Some(now as i64 - self.device_free? as i64)
    }

    /// What is held now that was not before.
    fn leaks_since(&self, device: &dyn Device, sim: Option<&SimDevice>) -> Vec<String> {
        let now = Self::measure(device, sim);
        let mut leaks = Vec::new();
        if now.fds > self.fds {
            leaks.push(format!("{} more open files than before the engine", now.fds - self.fds));
        }
        if let (Some(before), Some(after)) = (&self.sim, &now.sim) {
            if after != before {
                leaks.push(format!("the simulated device still holds {after:?} (before: {before:?})"));
            }
        }
        leaks
    }
}
