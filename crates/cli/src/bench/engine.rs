//! The engine suite: tiermem page-in / page-out / both at once against the raw copy
//! ceilings, an oversubscribed acquire cycle, and the cost of acquiring resident memory.

use super::{median, p99, raw, today};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde_json::json;
use std::path::Path;
use std::time::Instant;
use tiermem::mechanism::pattern;
use tiermem::mechanism::{BackendKind, StreamHandle, StreamPriority};
use tiermem::{Access, AllocOptions, BufferId, Engine, EngineConfig, Region, Target};

const WARMUP: usize = 2;
const OVERSUB_BUFFER: usize = 64 << 20;
const GIB: f64 = (1u64 << 30) as f64;

struct Bench {
    engine: Engine,
    stream: StreamHandle,
    verified: bool,
}

impl Bench {
    fn new(config: EngineConfig) -> Result<Self, String> {
        let engine = Engine::new(config).map_err(|e| format!("bench: {e}"))?;
        let stream = engine.device().create_stream(StreamPriority::High).map_err(|e| format!("bench: {e}"))?;
        Ok(Self { engine, stream, verified: true })
    }

    /// A buffer filled with the pattern of its id (left dirty in HBM).
    fn filled(&self, size: usize, name: &str) -> Result<BufferId, String> {
        let options = AllocOptions { name: Some(name.into()), ..Default::default() };
        let (id, _) = self.engine.alloc(size, options).map_err(|e| e.to_string())?;
        let mut data = vec![0u8; size];
        pattern::fill(id.0, 0, &mut data);
        self.engine.write(id, 0, &data).map_err(|e| e.to_string())?;
        Ok(id)
    }

    /// Acquires and releases for writing, as a kernel that updates the buffer would: its host
    /// copy is dropped, so the next page-out must copy (no clean-drop shortcut in the numbers).
    fn dirty(&self, id: BufferId) -> Result<(), String> {
        let region = [Region::whole(id)];
        self.engine.acquire(&region, Access::ReadWrite, self.stream).map_err(|e| e.to_string())?;
        self.engine.release(&region, self.stream).map_err(|e| e.to_string())?;
        self.engine.device().synchronize_stream(self.stream).map_err(|e| e.to_string())
    }

    /// Reads the buffer back and compares it with its pattern; records a mismatch.
    fn verify(&mut self, id: BufferId, size: usize) -> Result<(), String> {
        let mut data = vec![0u8; size];
        self.engine.read(id, 0, &mut data).map_err(|e| e.to_string())?;
        if let Some(at) = pattern::first_mismatch(id.0, 0, &data) {
            eprintln!("bench: VERIFICATION FAILED: buffer {id} differs at byte {at}");
            self.verified = false;
        }
        Ok(())
    }

    fn seconds(&self, op: impl FnOnce(&Engine) -> tiermem::Result<()>) -> Result<f64, String> {
        let t = Instant::now();
        op(&self.engine).map_err(|e| format!("bench: {e}"))?;
        Ok(t.elapsed().as_secs_f64())
    }
}

struct PageTimes {
    in_s: f64,
    out_s: f64,
}

/// Median page-out and page-in times of one buffer of `size` (dirty before each page-out).
fn page_cycle(b: &Bench, id: BufferId, reps: usize) -> Result<PageTimes, String> {
    let (mut ins, mut outs) = (Vec::new(), Vec::new());
    for rep in 0..reps + WARMUP {
        b.dirty(id)?;
        let out = b.seconds(|e| e.page_out(Target::Buffer(id)))?;
        let inn = b.seconds(|e| e.page_in(Target::Buffer(id)))?;
        if rep >= WARMUP {
            outs.push(out);
            ins.push(inn);
        }
    }
    Ok(PageTimes { in_s: median(ins), out_s: median(outs) })
}

/// Median seconds of moving one dirty resident buffer out while another comes in, with one
/// `exchange` (`together`) or with `page_out_start` then `page_in_start`.
fn inout_cycle(
    b: &Bench,
    mut resident: BufferId,
    mut away: BufferId,
    reps: usize,
    together: bool,
) -> Result<f64, String> {
    let mut samples = Vec::new();
    for rep in 0..reps + WARMUP {
        b.dirty(resident)?;
        let (out, inn) = (Target::Buffer(resident), Target::Buffer(away));
        let s = b.seconds(|e| {
            if together {
                return e.exchange(out, inn);
            }
            let down = e.page_out_start(out)?;
            let up = e.page_in_start(inn)?;
            e.finish(down)?;
            e.finish(up)
        })?;
        if rep >= WARMUP {
            samples.push(s);
        }
        std::mem::swap(&mut resident, &mut away);
    }
    Ok(median(samples))
}

/// Acquires every buffer for writing in `order`, pass after pass; median seconds per pass.
fn oversub_passes(b: &Bench, order: &[BufferId], passes: usize, shuffle_seed: Option<u64>) -> Result<f64, String> {
    let mut order = order.to_vec();
    let mut rng = shuffle_seed.map(rand_pcg::Pcg64Mcg::seed_from_u64);
    let mut samples = Vec::new();
    for pass in 0..passes + 1 {
        if let Some(rng) = rng.as_mut() {
            order.shuffle(rng);
        }
        let t = Instant::now();
        for &id in &order {
            let region = [Region::whole(id)];
            b.engine.acquire(&region, Access::ReadWrite, b.stream).map_err(|e| format!("bench: {e}"))?;
            b.engine.release(&region, b.stream).map_err(|e| format!("bench: {e}"))?;
        }
        b.engine.device().synchronize_stream(b.stream).map_err(|e| e.to_string())?;
        if pass >= 1 {
            samples.push(t.elapsed().as_secs_f64());
        }
    }
    Ok(median(samples))
}

/// What one configuration made of the sequential oversubscribed cycle.
struct Cycle {
    /// Median seconds per pass.
    seconds: f64,
    /// Bytes brought in per pass.
    moved: f64,
    verified: bool,
}

/// The sequential oversubscribed cycle over `count` fresh buffers on an engine of `config`.
fn sequential_cycle(config: EngineConfig, count: usize, passes: usize) -> Result<Cycle, String> {
    let mut b = Bench::new(config)?;
    let buffers: Vec<BufferId> =
        (0..count).map(|i| b.filled(OVERSUB_BUFFER, &format!("ws-{i}"))).collect::<Result<_, _>>()?;
    let seconds = oversub_passes(&b, &buffers, passes, None)?;
    let moved = moved_per_pass(&b, &buffers)?;
    for &id in &buffers {
        b.verify(id, OVERSUB_BUFFER)?;
    }
    Ok(Cycle { seconds, moved, verified: b.verified })
}

/// Bytes brought in per sequential pass over `order` (two more passes).
fn moved_per_pass(b: &Bench, order: &[BufferId]) -> Result<f64, String> {
    let chunk = b.engine.chunk_size() as f64;
    let before = b.engine.stats().transfers.page_ins;
    oversub_passes(b, order, 1, None)?;
    let passes = 2.0; // oversub_passes runs one more than it times
    Ok((b.engine.stats().transfers.page_ins - before) as f64 * chunk / passes)
}

/// Median microseconds of acquiring an already-resident 64-chunk buffer.
fn acquire_resident(b: &Bench, reps: usize) -> Result<f64, String> {
    let chunk = b.engine.chunk_size();
    let id = b.filled(64 * chunk, "resident-64")?;
    b.engine.page_in(Target::Buffer(id)).map_err(|e| e.to_string())?;
    let region = [Region::whole(id)];
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps + 100 {
        let t = Instant::now();
        b.engine.acquire(&region, Access::ReadOnly, b.stream).map_err(|e| e.to_string())?;
        samples.push(t.elapsed().as_secs_f64() * 1e6);
        b.engine.release(&region, b.stream).map_err(|e| e.to_string())?;
    }
    b.engine.free(id).map_err(|e| e.to_string())?;
    Ok(median(samples.split_off(100)))
}

/// Median microseconds of `advance` along a schedule of `steps` steps of three one-chunk
/// buffers, every one resident: the host time paging ahead costs a model that fits.
fn advance_resident(b: &Bench, steps: usize, reps: usize) -> Result<f64, String> {
    let chunk = b.engine.chunk_size();
    let ids = (0..3 * steps).map(|_| b.filled(chunk, "layer")).collect::<Result<Vec<_>, _>>()?;
    let fail = |e: tiermem::Error| e.to_string();
    b.engine.set_schedule(ids.chunks(3).map(<[_]>::to_vec).collect()).map_err(fail)?;
    for &id in &ids {
        b.engine.page_in(Target::Buffer(id)).map_err(fail)?;
    }
    let window = 16 * chunk;
    let mut samples = Vec::with_capacity(reps);
    for rep in 0..reps + 100 {
        let t = Instant::now();
        b.engine.advance(rep % steps, window).map_err(fail)?;
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    b.engine.clear_schedule();
    for id in ids {
        b.engine.free(id).map_err(fail)?;
    }
    Ok(median(samples.split_off(100)))
}

/// Median and 99th-percentile microseconds of acquiring an already-resident 64-chunk buffer on
/// this thread while another thread pages a buffer of `size` bytes out and in again and
/// again: what a cheap acquire pays for another thread's transfers (the engine's lock).
fn acquire_resident_under_load(b: &Bench, size: usize, reps: usize) -> Result<(f64, f64, usize), String> {
    let chunk = b.engine.chunk_size();
    let id = b.filled(64 * chunk, "resident-64-under-load")?;
    let mover = b.filled(size, "moving")?;
    b.engine.page_in(Target::Buffer(id)).map_err(|e| e.to_string())?;
    let region = [Region::whole(id)];
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (samples, cycles) = std::thread::scope(|scope| {
        let moving = scope.spawn(|| -> Result<usize, String> {
            let mut cycles = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                b.engine.page_out(Target::Buffer(mover)).map_err(|e| format!("bench: page_out: {e}"))?;
                b.engine.page_in(Target::Buffer(mover)).map_err(|e| format!("bench: page_in: {e}"))?;
                cycles += 1;
            }
            Ok(cycles)
        });
        let mut samples = Vec::with_capacity(reps);
        let measured = (|| -> Result<(), String> {
            for _ in 0..reps {
                let t = Instant::now();
                b.engine.acquire(&region, Access::ReadOnly, b.stream).map_err(|e| e.to_string())?;
                samples.push(t.elapsed().as_secs_f64() * 1e6);
                b.engine.release(&region, b.stream).map_err(|e| e.to_string())?;
                // Spread the samples over many transfers.
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            Ok(())
        })();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let cycles = moving.join().map_err(|_| "bench: the paging thread panicked".to_string())?;
        measured.map(|()| samples).and_then(|s| cycles.map(|c| (s, c)))
    })?;
    b.engine.free(id).map_err(|e| e.to_string())?;
    b.engine.free(mover).map_err(|e| e.to_string())?;
    let tail = p99(&samples);
    Ok((median(samples), tail, cycles))
}

pub fn run(dir: &Path, commit: &str, reps: usize, size: usize) -> Result<(), String> {
    // Against the PCIe ceilings: host and file tiers only, whatever neighbours could lend.
    let base = EngineConfig { peers: tiermem::PeerChoice::Off, ..EngineConfig::from_env().map_err(|e| e.to_string())? };
    let chunk_gb = |s: f64| size as f64 / 1e9 / s;
    let sim_hbm = 6 * size + (256 << 20);
    let mut b =
        Bench::new(EngineConfig { hbm_limit: Some(4 * size), host_limit: Some(4 * size), sim_hbm, ..base.clone() })?;
    let info = b.engine.device_info().clone();
    if info.backend == BackendKind::Sim {
        println!("WARNING: simulated device: these numbers are not GPU measurements and must not be committed.");
    }
    println!(
        "device: {} ({} of them), driver {}; transfers of {} MiB, {reps} reps, medians",
        info.name,
        info.device_count,
        info.driver_version,
        size >> 20
    );

    let ceilings = raw::measure(b.engine.device(), size, reps)?;
    println!(
        "raw pinned copies: H2D {:.1} GB/s, D2H {:.1} GB/s, both at once {:.1} GB/s",
        ceilings.h2d_gbps, ceilings.d2h_gbps, ceilings.bidir_gbps
    );

    let a = b.filled(size, "A")?;
    let big = page_cycle(&b, a, reps)?;
    let (page_in, page_out) = (chunk_gb(big.in_s), chunk_gb(big.out_s));
    println!(
        "tiermem page-in {page_in:.1} GB/s ({:.2} of raw), page-out {page_out:.1} GB/s ({:.2} of raw)",
        page_in / ceilings.h2d_gbps,
        page_out / ceilings.d2h_gbps
    );

    let chunk = b.engine.chunk_size();
    let one = b.filled(chunk, "one-chunk")?;
    let lone = page_cycle(&b, one, reps * 5)?;
    let mib = chunk >> 20;
    println!("lone {mib} MiB chunk: page-in {:.0} µs, page-out {:.0} µs", lone.in_s * 1e6, lone.out_s * 1e6);

    let away = b.filled(size, "B")?;
    b.engine.page_out(Target::Buffer(away)).map_err(|e| e.to_string())?;
    let both_s = inout_cycle(&b, a, away, reps, true)?;
    let page_inout = 2.0 * size as f64 / 1e9 / both_s;
    let separate = 2.0 * size as f64 / 1e9 / inout_cycle(&b, a, away, reps, false)?;
    println!("tiermem exchange (page-out + page-in at once) {page_inout:.1} GB/s ({:.2} of raw bidirectional); as two separate calls {separate:.1} GB/s", page_inout / ceilings.bidir_gbps);
    let free_chunks = b.engine.device().mem_info().map_err(|e| e.to_string())?.0 / b.engine.chunk_size();
    let vmm = raw::vmm_costs(b.engine.device(), free_chunks.min(512) / 32 * 32)?;
    let stall = raw::map_stall(b.engine.device(), size)?;
    println!("  map+access per chunk: {:.1} µs idle, {:.1} µs during a device-to-host copy, {:.1} µs during a host-to-device copy", stall.idle_us, stall.during_d2h_us, stall.during_h2d_us);
    println!("  map+access batches of 16 during the device-to-host copy (µs): {:.0?}; during it on a low-priority stream {:.1} µs per chunk, as 2 MiB copies {:.1} µs", stall.d2h_batches_us, stall.during_d2h_low_priority_us, stall.during_d2h_pieces_us);
    println!("  VMM per chunk: map+access {:.1} µs, unmap {:.1} µs on one thread; two threads at once: map+access {:.1} µs, unmap {:.1} µs (wall per chunk)", vmm.map_us, vmm.unmap_us, vmm.map_us_2threads, vmm.unmap_us_2threads);

    let acquire_us = acquire_resident(&b, 2000)?;
    println!("acquire of a resident 64-chunk buffer: {acquire_us:.2} µs (median)");
    let advance_steps = (4 * size / chunk / 6).min(112);
    let advance_us = advance_resident(&b, advance_steps, 2000)?;
    println!("advance along {advance_steps} steps of 3 resident chunks: {advance_us:.2} µs (median)");
    let (under_load_us, under_load_p99_us, load_cycles) = acquire_resident_under_load(&b, size, 2000)?;
    println!(
        "  the same while another thread pages {} MiB out and in ({load_cycles} times): {under_load_us:.2} µs median, {under_load_p99_us:.1} µs 99th percentile",
        size >> 20
    );
    for (id, bytes) in [(a, size), (away, size), (one, b.engine.chunk_size())] {
        b.verify(id, bytes)?;
    }
    let mut verified = b.verified;
    let engine_stats = b.engine.stats();
    drop(b);

    // Oversubscription: working set twice the cap, every acquire evicts.
    // The baseline is the policy alone: loops learned and pre-eviction are the variants below.
    let oversub = EngineConfig {
        hbm_limit: Some(2 * size),
        host_limit: Some(4 * size),
        sim_hbm,
        learn_loops: None,
        pre_evict: 0,
        ..base.clone()
    };
    let mut o = Bench::new(oversub.clone())?;
    let count = 4 * size / OVERSUB_BUFFER;
    let buffers: Vec<BufferId> =
        (0..count).map(|i| o.filled(OVERSUB_BUFFER, &format!("ws-{i}"))).collect::<Result<_, _>>()?;
    let set_gb = (count * OVERSUB_BUFFER) as f64 / 1e9;
    let passes = reps.min(3);
    let oversub_seq = set_gb / oversub_passes(&o, &buffers, passes, None)?;
    let oversub_rand = set_gb / oversub_passes(&o, &buffers, passes, Some(42))?;
    println!("oversubscribed cycle ({} buffers of 64 MiB, cap {} MiB): sequential {oversub_seq:.1} GB/s, random {oversub_rand:.1} GB/s acquired", count, (2 * size) >> 20);
    for &id in &buffers {
        o.verify(id, OVERSUB_BUFFER)?;
    }
    verified &= o.verified;
    let oversub_stats = o.engine.stats();
    let lru_moved = moved_per_pass(&o, &buffers)?;
    drop(o);

    // The same sequential cycle with the loop learned from the acquires (TIERMEM_LEARN_LOOPS):
    // Belady keeps what fits, a pass should move about (working set - cap) each way. And with
    // pre-eviction (TIERMEM_PRE_EVICT): victims start down before demand needs their room.
    let cycle = |config: EngineConfig| sequential_cycle(config, count, passes);
    let window = base.learn_loops.unwrap_or(256 << 20);
    let learned = cycle(EngineConfig { learn_loops: Some(window), ..oversub.clone() })?;
    let ahead = if base.pre_evict > 0 { base.pre_evict } else { 256 << 20 };
    let pre_evicted = cycle(EngineConfig { pre_evict: ahead, ..oversub })?;
    let (learned_seq, learned_moved) = (set_gb / learned.seconds, learned.moved);
    let optimum = (count * OVERSUB_BUFFER - 2 * size) as f64;
    println!(
        "the same, loop learned from the acquires: {learned_seq:.1} GB/s acquired, {:.2} GiB in per pass ({:.2}x the optimum; LRU {:.2} GiB)",
        learned_moved / GIB,
        learned_moved / optimum,
        lru_moved / GIB
    );
    let pre_evict_seq = set_gb / pre_evicted.seconds;
    println!("the same, {} MiB kept free by pre-eviction: {pre_evict_seq:.1} GB/s acquired", ahead >> 20);
    verified &= learned.verified && pre_evicted.verified;
    println!("verified: {verified}");

    let date = today();
    let report = super::report(
        "engine",
        commit,
        &date,
        &info,
        json!({
            "raw_h2d_GBps": ceilings.h2d_gbps,
            "raw_d2h_GBps": ceilings.d2h_gbps,
            "raw_bidir_GBps": ceilings.bidir_gbps,
            "page_in_GBps": page_in,
            "page_out_GBps": page_out,
            "page_inout_GBps": page_inout,
            "oversub_seq_GBps": oversub_seq,
            "oversub_rand_GBps": oversub_rand,
            "oversub_seq_learned_GBps": learned_seq,
            "oversub_seq_bytes_in_per_pass": lru_moved,
            "oversub_seq_learned_bytes_in_per_pass": learned_moved,
            "oversub_seq_pre_evict_GBps": pre_evict_seq,
            "acquire_resident_us": acquire_us,
            "acquire_resident_us_under_load": under_load_us,
            "advance_resident_us": advance_us,
        }),
        json!({
            "page_in": page_in / ceilings.h2d_gbps,
            "page_out": page_out / ceilings.d2h_gbps,
            "page_inout": page_inout / ceilings.bidir_gbps,
            "oversub_learned_vs_lru": learned_seq / oversub_seq,
            "oversub_learned_moved_vs_optimum": learned_moved / optimum,
            "oversub_pre_evict_vs_lru": pre_evict_seq / oversub_seq,
        }),
        verified,
    );
    let detail = json!({
        "suite": "engine-detail",
        "commit": commit,
        "date": date,
        "backend": info.backend.to_string(),
        "transfer_bytes": size,
        "chunk_bytes": chunk,
        "reps": reps,
        "lone_chunk_page_in_us": lone.in_s * 1e6,
        "acquire_resident_under_load_p99_us": under_load_p99_us,
        "acquire_resident_under_load_cycles": load_cycles,
        "advance_resident_steps": advance_steps,
        "lone_chunk_page_out_us": lone.out_s * 1e6,
        "page_in_ms": big.in_s * 1e3,
        "page_out_ms": big.out_s * 1e3,
        "page_inout_ms": both_s * 1e3,
        "page_inout_separate_calls_GBps": separate,
        "map_and_access_us_per_chunk_while_copying": { "idle": stall.idle_us, "during_d2h": stall.during_d2h_us, "during_h2d": stall.during_h2d_us, "during_d2h_low_priority_stream": stall.during_d2h_low_priority_us, "during_d2h_as_2MiB_copies": stall.during_d2h_pieces_us, "d2h_batches_of_16_us": stall.d2h_batches_us },
        "vmm_us_per_chunk": { "map_and_access": vmm.map_us, "unmap": vmm.unmap_us, "map_and_access_two_threads": vmm.map_us_2threads, "unmap_two_threads": vmm.unmap_us_2threads },
        "oversub_buffers": count,
        "oversub_buffer_bytes": OVERSUB_BUFFER,
        "oversub_hbm_cap_bytes": 2 * size,
        "engine_stats": format!("{engine_stats}"),
        "oversub_stats": format!("{oversub_stats}"),
        "targets": { "page_in": 0.9, "page_out": 0.9, "page_inout": 0.85, "acquire_resident_us": 2.0, "acquire_resident_us_under_load": 5.0 },
    });
    super::write_report(dir, "engine", &date, commit, &report, &detail)?;
    if verified {
        Ok(())
    } else {
        Err("bench: verification failed (see above)".into())
    }
}
