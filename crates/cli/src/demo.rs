//! `tiermem demo`: twice the HBM cap of data, moved by acquire/release, every byte verified.
//!
//! The first round rewrites every buffer from the host while it is acquired (a stand-in for
//! a kernel); the rounds after it are only acquire/release, and they alone are timed, beside
//! the link's ceiling (raw pinned copies through the same device, measured in the same run),
//! so the ratio shows what the engine adds on top of the copies themselves.

use crate::bench::raw;
use std::time::Instant;
use tiermem::mechanism::pattern;
use tiermem::mechanism::{BackendKind, StreamPriority};
use tiermem::{format_size, parse_size, Access, AllocOptions, BufferId, Engine, EngineConfig, Region};

#[derive(clap::Args)]
pub struct DemoArgs {
    /// HBM cap for the demo (default: 2GiB on a GPU, 128MiB on the simulated device, or TIERMEM_HBM_LIMIT).
    #[arg(long, value_parser = parse_size)]
    hbm_limit: Option<usize>,
    /// Acquire/release passes over all buffers: the first rewrites them, the others are timed
    /// (at least 2).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(2..))]
    rounds: u64,
    /// Size of each buffer.
    #[arg(long, value_parser = parse_size, default_value = "64MiB")]
    buffer_size: usize,
}

/// Size and repetitions of each raw copy timed for the ceiling.
const CEILING_BYTES: usize = 256 << 20;
const CEILING_REPS: usize = 5;

pub fn run(args: DemoArgs) -> Result<(), String> {
    let mut config = EngineConfig::from_env().map_err(|e| e.to_string())?;
    let probe = Engine::new(config.clone()).map_err(|e| format!("demo: {e}"))?;
    let simulated = probe.device_info().backend == BackendKind::Sim;
    if let Some(why) = probe.fallback_reason() {
        println!("No GPU: {why}");
    }
    if simulated {
        println!("Running on the SIMULATED device (host memory stands in for HBM): this checks the logic, the numbers say nothing about GPU speed.");
    }
    let default_cap = if simulated { 128 << 20 } else { 2 << 30 };
    config.hbm_limit = Some(args.hbm_limit.or(config.hbm_limit).unwrap_or(default_cap));
    if simulated {
        config.sim_hbm = config.hbm_limit.unwrap_or(default_cap) + (64 << 20);
    }
    drop(probe);
    let engine = Engine::new(config).map_err(|e| format!("demo: {e}"))?;
    let info = engine.device_info();
    let cap = engine.hbm_cap();
    let size = args.buffer_size.next_multiple_of(engine.chunk_size());
    let count = (2 * cap).div_ceil(size);
    println!(
        "device: {} | HBM cap {} | {} buffers of {} = {} | policy {}",
        info.name,
        format_size(cap),
        count,
        format_size(size),
        format_size(count * size),
        engine.policy()
    );

    let started = Instant::now();
    let mut buffers = Vec::with_capacity(count);
    let mut scratch = vec![0u8; size];
    for i in 0..count {
        let name = format!("demo-{i}");
        let (id, _) =
            engine.alloc(size, AllocOptions { name: Some(name), ..Default::default() }).map_err(|e| e.to_string())?;
        pattern::fill(seed(id, 0), 0, &mut scratch);
        engine.write(id, 0, &scratch).map_err(|e| e.to_string())?;
        buffers.push(id);
    }
    println!("wrote {} of patterns in {:.2} s", format_size(count * size), started.elapsed().as_secs_f64());

    let stream = engine.device().create_stream(StreamPriority::High).map_err(|e| e.to_string())?;
    for &id in &buffers {
        let region = [Region::whole(id)];
        engine.acquire(&region, Access::ReadWrite, stream).map_err(|e| e.to_string())?;
        // A "kernel" rewrites the buffer through its device pointer while it is acquired.
        pattern::fill(seed(id, 1), 0, &mut scratch);
        engine.device().synchronize_stream(stream).map_err(|e| e.to_string())?;
        let ptr = engine.device_ptr(id).map_err(|e| e.to_string())?;
        engine.device().write(ptr, &scratch).map_err(|e| e.to_string())?;
        engine.release(&region, stream).map_err(|e| e.to_string())?;
    }

    // The steady rounds: acquire for writing (so every eviction copies down) and release.
    let steady = args.rounds - 1;
    let before = engine.stats();
    let cycle = Instant::now();
    for _ in 0..steady {
        for &id in &buffers {
            let region = [Region::whole(id)];
            engine.acquire(&region, Access::ReadWrite, stream).map_err(|e| e.to_string())?;
            engine.release(&region, stream).map_err(|e| e.to_string())?;
        }
    }
    engine.device().synchronize_stream(stream).map_err(|e| e.to_string())?;
    let seconds = cycle.elapsed().as_secs_f64();
    let after = engine.stats();
    let moved = (after.bytes_in - before.bytes_in) + (after.bytes_out - before.bytes_out);
    let gbps = moved as f64 / seconds / 1e9;
    println!(
        "{steady} steady rounds of acquire/release over {} (after one rewriting round): moved {} in {:.2} s = {gbps:.1} GB/s (in + out){}",
        format_size(count * size),
        format_size(moved as usize),
        seconds,
        if simulated { " [simulated: host memory copies, not a GPU speed]" } else { "" }
    );
    if simulated {
        println!("link ceiling: not measured (the simulated device has no clock to time copies with)");
    } else {
        let ceiling = raw::measure(engine.device(), CEILING_BYTES, CEILING_REPS)?;
        println!(
            "link ceiling, measured now: raw pinned copies H2D {:.1} GB/s, D2H {:.1} GB/s, both at once {:.1} GB/s",
            ceiling.h2d_gbps, ceiling.d2h_gbps, ceiling.bidir_gbps
        );
        println!(
            "steady rounds / both-at-once ceiling = {:.2} (data moves in and out at once; 1.00 would be the link's limit)",
            gbps / ceiling.bidir_gbps
        );
    }

    let mut verified = 0usize;
    for &id in &buffers {
        engine.read(id, 0, &mut scratch).map_err(|e| e.to_string())?;
        if let Some(at) = pattern::first_mismatch(seed(id, 1), 0, &scratch) {
            return Err(format!("demo: VERIFICATION FAILED: buffer {id} differs at byte {at}"));
        }
        verified += scratch.len();
    }
    println!("verified every byte: {} match", format_size(verified));
    println!();
    print!("{}", engine.stats());
    engine.device().destroy_stream(stream).map_err(|e| e.to_string())?;
    for id in buffers {
        engine.free(id).map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn seed(id: BufferId, generation: u64) -> u64 {
    id.0 * 1_000_003 + generation
}
