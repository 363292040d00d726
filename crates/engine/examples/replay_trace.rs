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
use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiermem::mechanism::sim::{SimDevice, Timing};
use tiermem::mechanism::{BackendChoice, Device, StreamPriority};
use tiermem::{Access, AllocOptions, BufferId, Engine, EngineConfig, Region};

type Fallible<T> = Result<T, Box<dyn Error>>;

/// The `n`-th field of a trace line, parsed.
fn field<T: std::str::FromStr>(line: &str, n: usize) -> Fallible<T>
where
    T::Err: Error + 'static,
{
    let text = line.split(' ').nth(n).ok_or_else(|| format!("trace line {line:?}: no field {n}"))?;
    Ok(text.parse::<T>().map_err(|e| format!("trace line {line:?}, field {n}: {e}"))?)
}

fn main() -> Fallible<()> {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).ok_or("usage: replay_trace TRACE [eager|lazy|random|cuda] [WINDOW_MIB]")?;
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let mode = args.get(2).map_or("eager", String::as_str);
    let window_override = args.get(3).map(|w| w.parse::<usize>().map(|w| w << 20)).transpose()?;
    // `SWITCH=N:MIB`: from the N-th pass on, every step pages ahead MIB instead.
    let switch = match std::env::var("SWITCH") {
        Ok(v) => {
            let (n, w) = v.split_once(':').ok_or("SWITCH=N:MIB")?;
            Some((n.parse::<usize>()?, w.parse::<usize>()? << 20))
        }
        Err(_) => None,
    };
    let mut lines = text.lines();
    let (cap, model): (usize, usize) =
        (field(lines.next().unwrap_or_default(), 1)?, field(lines.next().unwrap_or_default(), 1)?);
    let config =
        EngineConfig { hbm_limit: Some(cap), host_limit: Some(model + (256 << 20)), ..EngineConfig::from_env()? };
    let engine = match mode {
        "cuda" => Engine::new(EngineConfig { backend: BackendChoice::Cuda, ..config })?,
        "eager" | "lazy" | "random" => {
            let sim = Arc::new(SimDevice::new(cap + (64 << 20))?);
            sim.set_timing(match mode {
                "lazy" => Timing::Lazy,
                "random" => Timing::Random,
                _ => Timing::Eager,
            });
            let device: Arc<dyn Device> = sim;
            Engine::with_device(device, &config)?
        }
        other => return Err(format!("unknown mode {other:?}: eager, lazy, random or cuda").into()),
    };
    let device = Arc::clone(engine.device());
    let stream = device.create_stream(StreamPriority::High)?;
    let staging = device.alloc_pinned(1 << 20)?;
    let mut ids: HashMap<u64, BufferId> = HashMap::new();
    let buffers = |ids: &HashMap<u64, BufferId>, line: &str, skip: usize| -> Fallible<Vec<BufferId>> {
        line.split(' ')
            .skip(skip)
            .map(|x| Ok(*ids.get(&x.parse::<u64>()?).ok_or_else(|| format!("buffer {x} not in the trace"))?))
            .collect()
    };
    let (mut last, mut passes, mut step_time, mut step_times) = (0u64, Vec::new(), Duration::ZERO, Vec::new());
    for line in lines {
        match line.split(' ').next().unwrap_or_default() {
            "buffer" => {
                ids.insert(field(line, 1)?, engine.alloc(field(line, 2)?, AllocOptions::default())?.0);
            }
            "pass" => engine.pass_begins()?,
            "step" => {
                let window = match switch {
                    Some((n, w)) if passes.len() >= n => w,
                    _ => window_override.map_or_else(|| field(line, 2), Ok)?,
                };
                let started = Instant::now();
                engine.step_enters(field(line, 1)?, &buffers(&ids, line, 3)?, window)?;
                step_time += started.elapsed();
            }
            "acquire" => {
                let access = if field::<u8>(line, 1)? == 1 { Access::ReadWrite } else { Access::ReadOnly };
                let ids = buffers(&ids, line, 2)?;
                engine.acquire(&ids.iter().map(|&id| Region::whole(id)).collect::<Vec<_>>(), access, stream)?;
                for &id in &ids {
                    let va = engine.device_ptr(id)?;
                    // SAFETY: the staging is 1 MiB of pinned memory that only these reads write.
                    unsafe { device.copy_to_host_async(staging, va, 4096, stream) }?;
                }
            }
            "release" => {
                let regions: Vec<Region> = buffers(&ids, line, 1)?.into_iter().map(Region::whole).collect();
                engine.release(&regions, stream)?;
            }
            "mark" => {
                let now = engine.stats().transfers.page_ins * engine.chunk_size() as u64;
                passes.push((now - last) >> 20);
                step_times.push((step_time.as_secs_f64() * 1e4).round() / 10.0);
                (last, step_time) = (now, Duration::ZERO);
            }
            "" => {}
            other => return Err(format!("unknown trace line {other:?}").into()),
        }
    }
    device.synchronize_stream(stream)?;
    device.free_pinned(staging, 1 << 20)?;
    device.destroy_stream(stream)?;
    let steady: Vec<u64> = passes.iter().rev().take(8).copied().collect();
    let mean = steady.iter().sum::<u64>() as f64 / steady.len().max(1) as f64;
    let optimum = ((model - cap) >> 20) as f64;
    println!("ms in step_enters per pass: {step_times:?}");
    println!("{mode}: MiB paged in per pass: {passes:?}");
    println!("steady {mean:.0} MiB, optimum {optimum:.0}, ratio {:.3}", mean / optimum);
    Ok(())
}
