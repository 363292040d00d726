//! Replays a trace of the engine calls a program made (scripts/gpu/probes/record_trace.py
//! records one from `tiermem.torch` on the GPU) and prints the bytes paged in per pass: the
//! engine's traffic for that program, on the simulated device (`eager`, `lazy` or `random`
//! timing: see `SimDevice::set_timing`) or on the GPU (`cuda`). Each acquire is followed by a
//! "kernel" (a small read of the buffer on the stream), so that with lagging timing the GPU
//! falls behind the host as a link-bound decode does. On the H200 a tied Llama's trace moved
//! exactly what the decode itself moved, and the simulated device's traffic matched the GPU's.
//!
//! Usage: `replay_trace TRACE [eager|lazy|random|cuda] [WINDOW_MIB]`; WINDOW_MIB replaces every
//! step's paging-ahead window; `SWITCH=N:MIB` replaces it from the N-th pass on.
//!
//! The trace, one call a line: `cap BYTES`, `model BYTES`, then `buffer ID BYTES` for each
//! buffer, then `pass` (`pass_begins`), `step KEY WINDOW ID…` (`step_enters`), `acquire WRITE
//! ID…`, `release ID…`, and `mark` where a pass ends (the bytes paged in are read there).

use std::collections::HashMap;
use std::sync::Arc;
use tiermem::mechanism::sim::{SimDevice, Timing};
use tiermem::mechanism::{Device, StreamPriority};
use tiermem::{Access, AllocOptions, BufferId, Engine, EngineConfig, Region};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let text = std::fs::read_to_string(&args[1]).expect("trace");
    let timing = match args.get(2).map(String::as_str) {
        Some("lazy") => Timing::Lazy,
        Some("random") => Timing::Random,
        _ => Timing::Eager,
    };
    let window_override: Option<usize> = args.get(3).map(|w| w.parse::<usize>().unwrap() << 20);
    let mut lines = text.lines();
    let cap: usize = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let model: usize = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let config = EngineConfig {
        hbm_limit: Some(cap),
        host_limit: Some(model + (256 << 20)),
        ..EngineConfig::from_env().unwrap()
    };
    let engine = if args.get(2).map(String::as_str) == Some("cuda") {
        Engine::new(EngineConfig { backend: tiermem::mechanism::BackendChoice::Cuda, ..config }).unwrap()
    } else {
        let sim = Arc::new(SimDevice::new(cap + (64 << 20)).unwrap());
        sim.set_timing(timing);
        let device: Arc<dyn Device> = sim.clone();
        Engine::with_device(device, &config).unwrap()
    };
    let device = Arc::clone(engine.device());
    let stream = device.create_stream(StreamPriority::High).unwrap();
    let staging = device.alloc_pinned(1 << 20).unwrap();
    // `SWITCH=N:MIB`: from the N-th mark on, every step pages ahead MIB instead.
    let switch: Option<(usize, usize)> = std::env::var("SWITCH").ok().map(|v| {
        let (n, w) = v.split_once(':').expect("SWITCH=N:MIB");
        (n.parse().expect("N"), w.parse::<usize>().expect("MIB") << 20)
    });
    let mut ids: HashMap<u64, BufferId> = HashMap::new();
    let (mut last, mut passes) = (0u64, Vec::new());
    let mut step_time = std::time::Duration::ZERO;
    let mut step_times = Vec::new();
    for line in lines {
        let mut f = line.split(' ');
        match f.next().unwrap() {
            "buffer" => {
                let (k, size): (u64, usize) = (f.next().unwrap().parse().unwrap(), f.next().unwrap().parse().unwrap());
                ids.insert(k, engine.alloc(size, AllocOptions::default()).unwrap().0);
            }
            "pass" => engine.pass_begins().unwrap(),
            "step" => {
                let key: u64 = f.next().unwrap().parse().unwrap();
                let window: usize = f.next().unwrap().parse().unwrap();
                let b: Vec<BufferId> = f.map(|x| ids[&x.parse::<u64>().unwrap()]).collect();
                let window = match switch {
                    Some((n, w)) if passes.len() >= n => w,
                    _ => window_override.unwrap_or(window),
                };
                let t0 = std::time::Instant::now();
                engine.step_enters(key, &b, window).unwrap();
                step_time += t0.elapsed();
            }
            "acquire" => {
                let write = f.next().unwrap() == "1";
                let b: Vec<BufferId> = f.map(|x| ids[&x.parse::<u64>().unwrap()]).collect();
                let access = if write { Access::ReadWrite } else { Access::ReadOnly };
                let r: Vec<Region> = b.iter().map(|&id| Region::whole(id)).collect();
                engine.acquire(&r, access, stream).unwrap();
                for &id in &b {
                    let va = engine.device_ptr(id).unwrap();
                    // SAFETY: the staging is pinned, 1 MiB, and only these reads write it.
                    unsafe { device.copy_to_host_async(staging, va, 4096, stream) }.unwrap();
                }
            }
            "release" => {
                let r: Vec<Region> = f.map(|x| Region::whole(ids[&x.parse::<u64>().unwrap()])).collect();
                engine.release(&r, stream).unwrap();
            }
            "mark" => {
                let now = engine.stats().transfers.page_ins * (2 << 20);
                passes.push((now - last) >> 20);
                step_times.push(step_time.as_secs_f64() * 1e3);
                step_time = std::time::Duration::ZERO;
                last = now;
            }
            "" => {}
            other => panic!("unknown {other}"),
        }
    }
    device.synchronize_stream(stream).unwrap();
    let steady: Vec<u64> = passes.iter().rev().take(8).copied().collect();
    let mean = steady.iter().sum::<u64>() as f64 / steady.len() as f64;
    let optimum = ((model - cap) >> 20) as f64;
    println!(
        "ms in step_enters per pass: {:?}",
        step_times.iter().map(|t| (t * 10.0).round() / 10.0).collect::<Vec<_>>()
    );
    println!(
        "{:?} MiB per pass: {passes:?}\nsteady {mean:.0} MiB, optimum {optimum:.0}, ratio {:.3}",
        timing,
        mean / optimum
    );
}
