//! The swap-store suite: the VRAM swap device's store ([`VramStore`]) alone — no loop device, no
//! FUSE, no root — so that a swap read's latency can be split between the store and the layers
//! above it. Through loop and FUSE a 32 KiB read at queue depth 1 takes ~75 µs, ~61 µs of it in
//! the FUSE server (target ≤ 50 µs); this says how much of that is the store and which call.
//!
//! 1. Opens a store of `--size` bytes (no spill file, no monitor thread, limits that let the
//!    whole device sit in HBM) and writes it whole, each 8-byte word a hash of its offset
//!    (`pattern`), so every area is present in HBM.
//! 2. Times `--ops` reads of 32 KiB and of 4 KiB and writes of 4 KiB, one at a time on one
//!    thread, at random offsets aligned to the request's size (as fio's are: a request never
//!    spans two chunks); every byte read is checked.
//! 3. The 32 KiB reads from 8 threads at once (the ops shared out): latency and requests/s.
//! 4. The read path's steps, done directly on the store's engine as `in_lane` and `engine_read`
//!    (crates/swap/src/store.rs) do them, each timed: acquire, the asynchronous copy into pinned
//!    staging on a high-priority stream, the stream's synchronization, release, the CPU copy
//!    out of staging; beside them a bare copy + synchronization and an idle stream's
//!    synchronization. The read's latency less the steps is the store's own share (area lock,
//!    present bits, gate, lanes): `store_overhead_us_p50`.
//! 5. Steps 1, the single-thread 32 KiB reads and 4 again on a store whose engine learns no
//!    loops (`learn_loops: None`; the store inherits the engine's default, on), side by side in
//!    `learn_loops_on` / `learn_loops_off`: a swap device's acquires are random, and learning
//!    loops from them may only cost.

use super::{median, p99, today};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde_json::{json, Map, Value};
use std::path::Path;
use std::sync::Barrier;
use std::time::Instant;
use tiermem::mechanism::{pattern, BackendKind, HostPtr, StreamHandle, StreamPriority};
use tiermem::{Access, AllocOptions, BufferId, Engine, EngineConfig, Region};
use tiermem_swap::{Blocks, Limits, StoreConfig, VramStore, PAGE};

const SEED: u64 = 0x5ea1_5708_e000_0001;
const STEP_SEED: u64 = 0x5ea1_5708_e000_0002;
const K4: usize = 4 << 10;
const K32: usize = 32 << 10;
const THREADS: usize = 8;
/// Untimed requests before each single-thread series.
const WARMUP: usize = 200;
/// Chunks of the buffer the steps read from.
const STEP_CHUNKS: usize = 4;
const TARGET_US: f64 = 50.0;

fn err<E: std::fmt::Display>(call: &'static str) -> impl FnOnce(E) -> String {
    move |e| format!("bench swap-store: {call}: {e}")
}

fn us_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e6
}

/// Mean, median and 99th percentile of some latencies, in µs.
#[derive(Debug, Clone, Copy)]
struct Lat {
    mean: f64,
    p50: f64,
    p99: f64,
}

impl Lat {
    fn of(us: Vec<f64>) -> Self {
        if us.is_empty() {
            return Self { mean: 0.0, p50: 0.0, p99: 0.0 };
        }
        let mean = us.iter().sum::<f64>() / us.len() as f64;
        Self { mean, p99: p99(&us), p50: median(us) }
    }

    /// `<name>_us_p50` and `<name>_us_p99` (and `_mean` when `mean`) into `out`.
    fn put(&self, out: &mut Map<String, Value>, name: &str, mean: bool) {
        if mean {
            out.insert(format!("{name}_us_mean"), json!(self.mean));
        }
        out.insert(format!("{name}_us_p50"), json!(self.p50));
        out.insert(format!("{name}_us_p99"), json!(self.p99));
    }
}

/// The read path's calls, timed one by one (item 4), in this order; `step_total` is the first
/// five together, as `in_lane` and `engine_read` run them.
const STEPS: [&str; 8] = [
    "step_acquire",
    "step_copy_async",
    "step_sync",
    "step_release",
    "step_memcpy",
    "step_total",
    "raw_copy_sync",
    "idle_sync",
];
const TOTAL: usize = 5;

/// A store of `size` bytes as `tiermem swap on` opens one, with no spill file, no monitor and
/// limits that let it take all free VRAM; `learn`: the engine's default learned loops, or none.
fn open(size: u64, learn: bool) -> Result<(VramStore, Option<usize>), String> {
    let env = EngineConfig::from_env().map_err(err("the TIERMEM_* settings"))?;
    let mut config = StoreConfig::new(size, None);
    config.engine.backend = env.backend;
    config.engine.device = env.device;
    // The simulated device holds the store, the steps' buffer and some slack (unused on a GPU).
    config.engine.sim_hbm = size as usize + (64 << 20);
    if !learn {
        config.engine.learn_loops = None;
    }
    config.limits = Limits { soft_free: 0, hard_free: 0, grow_margin: 0, ..Limits::default() };
    config.poll = None;
    let learn_loops = config.engine.learn_loops;
    Ok((VramStore::open(config).map_err(err("VramStore::open"))?, learn_loops))
}

/// Writes the whole device once, a chunk per request; GB/s.
fn fill(store: &VramStore) -> Result<f64, String> {
    let (size, chunk) = (store.size(), store.engine().chunk_size());
    let mut data = vec![0u8; chunk];
    let t = Instant::now();
    let mut at = 0;
    while at < size {
        let len = chunk.min((size - at) as usize);
        pattern::fill(SEED, at as usize, &mut data[..len]);
        store.write(at, &data[..len]).map_err(err("VramStore::write"))?;
        at += len as u64;
    }
    Ok(size as f64 / 1e9 / t.elapsed().as_secs_f64())
}

/// Latencies in µs, and reads that did not match.
type Timed = (Vec<f64>, u64);

/// `warmup + ops` requests of `len` bytes at random offsets aligned to `len`, one at a time,
/// writing the pattern back or reading and checking it.
fn series(store: &VramStore, write: bool, len: usize, warmup: usize, ops: usize, seed: u64) -> Result<Timed, String> {
    let slots = store.size() / len as u64;
    let mut rng = Pcg64Mcg::seed_from_u64(seed);
    let mut buf = vec![0u8; len];
    let (mut lat, mut bad) = (Vec::with_capacity(ops), 0);
    for i in 0..warmup + ops {
        let at = rng.random_range(0..slots) * len as u64;
        let us = if write {
            pattern::fill(SEED, at as usize, &mut buf);
            let t = Instant::now();
            store.write(at, &buf).map_err(err("VramStore::write"))?;
            us_since(t)
        } else {
            let t = Instant::now();
            store.read(at, &mut buf).map_err(err("VramStore::read"))?;
            let us = us_since(t);
            bad += u64::from(pattern::first_mismatch(SEED, at as usize, &buf).is_some());
            us
        };
        if i >= warmup {
            lat.push(us);
        }
    }
    Ok((lat, bad))
}

/// The 32 KiB reads from `THREADS` threads at once, `ops` in all: latencies, kops/s, mismatches.
fn threaded(store: &VramStore, ops: usize) -> Result<(Lat, f64, u64), String> {
    let per = (ops / THREADS).max(1);
    let start = Barrier::new(THREADS + 1);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|i| {
                let start = &start;
                scope.spawn(move || {
                    start.wait();
                    series(store, false, K32, 0, per, SEED ^ (100 + i as u64))
                })
            })
            .collect();
        start.wait();
        let t = Instant::now();
        let joined: Vec<_> = workers.into_iter().map(|worker| worker.join()).collect();
        let seconds = t.elapsed().as_secs_f64();
        let (mut all, mut bad) = (Vec::with_capacity(per * THREADS), 0);
        for result in joined {
            let (lat, b) = result.map_err(|_| "bench swap-store: a reading thread panicked".to_string())??;
            all.extend(lat);
            bad += b;
        }
        Ok((Lat::of(all), (per * THREADS) as f64 / seconds / 1e3, bad))
    })
}

/// The 32 KiB reads as the FUSE server serves them: each handed to a thread asleep on a
/// channel, which reads and answers, with a pause between requests (the server's thread sleeps
/// while the kernel completes one request and the program makes the next). Latencies of the
/// read in the woken thread and of the whole round trip, and mismatches.
fn handed(store: &VramStore, ops: usize) -> Result<(Lat, Lat, u64), String> {
    let slots = store.size() / K32 as u64;
    let (to_worker, requests) = std::sync::mpsc::channel::<u64>();
    let (to_main, answers) = std::sync::mpsc::channel::<Result<(f64, bool), String>>();
    std::thread::scope(|scope| {
        scope.spawn(move || {
            let mut buf = vec![0u8; K32];
            for at in requests {
                let t = Instant::now();
                let read = store.read(at, &mut buf).map_err(err("VramStore::read"));
                let answer = read.map(|()| (us_since(t), pattern::first_mismatch(SEED, at as usize, &buf).is_some()));
                if to_main.send(answer).is_err() {
                    break;
                }
            }
        });
        let mut rng = Pcg64Mcg::seed_from_u64(SEED ^ 0x5eed);
        let (mut woken, mut trips, mut bad) = (Vec::with_capacity(ops), Vec::with_capacity(ops), 0);
        for i in 0..WARMUP + ops {
            std::thread::sleep(std::time::Duration::from_micros(50));
            let t = Instant::now();
            to_worker.send(rng.random_range(0..slots) * K32 as u64).map_err(err("the reading thread"))?;
            let (us, mismatch) = answers.recv().map_err(err("the reading thread"))??;
            if i >= WARMUP {
                woken.push(us);
                trips.push(us_since(t));
            }
            bad += u64::from(mismatch);
        }
        drop(to_worker);
        Ok((Lat::of(woken), Lat::of(trips), bad))
    })
}

/// Item 4 on the store's engine: a buffer of a few chunks, a stream and a pinned chunk of
/// staging as a lane has (lanes.rs), freed again whatever happens.
fn steps(store: &VramStore, iters: usize) -> Result<([Lat; STEPS.len()], u64), String> {
    let engine = store.engine();
    let device = engine.device();
    let chunk = engine.chunk_size();
    let size = STEP_CHUNKS * chunk;
    let (id, va) = engine.alloc(size, AllocOptions::default()).map_err(err("Engine::alloc"))?;
    let mut data = vec![0u8; size];
    pattern::fill(STEP_SEED, 0, &mut data);
    let written = engine.write(id, 0, &data).map_err(err("Engine::write"));
    drop(data);
    let lane = written.and_then(|()| {
        let stream = device.create_stream(StreamPriority::High).map_err(err("cuStreamCreateWithPriority"))?;
        match device.alloc_pinned(chunk) {
            Ok(staging) => Ok((stream, staging)),
            Err(e) => {
                let _ = device.destroy_stream(stream);
                Err(err("cuMemHostAlloc")(e))
            }
        }
    });
    let measured = lane.and_then(|(stream, staging)| {
        let measured = time_steps(engine, (id, va, size), stream, staging, iters);
        let stream_gone = device.destroy_stream(stream).map_err(err("cuStreamDestroy"));
        let staging_gone = device.free_pinned(staging, chunk).map_err(err("cuMemFreeHost"));
        measured.and_then(|s| stream_gone.and(staging_gone).map(|()| s))
    });
    let freed = engine.free(id).map_err(err("Engine::free"));
    measured.and_then(|s| freed.map(|()| s))
}

fn time_steps(
    engine: &Engine,
    (id, va, size): (BufferId, u64, usize),
    stream: StreamHandle,
    staging: HostPtr,
    iters: usize,
) -> Result<([Lat; STEPS.len()], u64), String> {
    let device = engine.device();
    let slots = size / K32;
    let mut rng = Pcg64Mcg::seed_from_u64(STEP_SEED);
    let mut out = vec![0u8; K32];
    let mut t: [Vec<f64>; STEPS.len()] = Default::default();
    let mut mismatches = 0;
    for i in 0..WARMUP + iters {
        let at = rng.random_range(0..slots) * K32;
        let regions = [Region::bytes(id, at, K32)];
        // As `in_lane`: acquire on the lane's stream, copy, synchronize, release also on failure.
        let t0 = Instant::now();
        engine.acquire(&regions, Access::ReadOnly, stream).map_err(err("Engine::acquire"))?;
        let t1 = Instant::now();
        // SAFETY: `staging` is a chunk (≥ 32 KiB) of pinned memory from this device that nothing
        // else touches; it is read only after the stream is synchronized below.
        let copied = unsafe { device.copy_to_host_async(staging, va + at as u64, K32, stream) }
            .map_err(err("cuMemcpyDtoHAsync"));
        let t2 = Instant::now();
        let synced = copied.and_then(|()| device.synchronize_stream(stream).map_err(err("cuStreamSynchronize")));
        let t3 = Instant::now();
        let released = engine.release(&regions, stream).map_err(err("Engine::release"));
        let t4 = Instant::now();
        synced.and(released)?;
        // SAFETY: the copy into the staging has completed (the stream was synchronized); `out`
        // and the staging are both at least 32 KiB and do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(staging as *const u8, out.as_mut_ptr(), K32) };
        let t5 = Instant::now();
        mismatches += u64::from(pattern::first_mismatch(STEP_SEED, at, &out).is_some());
        if i >= WARMUP {
            for (samples, (a, b)) in t.iter_mut().zip([(t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5), (t0, t5)]) {
                samples.push((b - a).as_secs_f64() * 1e6);
            }
        }
    }
    // The same copy with no engine call (the whole buffer acquired once), then an idle stream.
    let whole = [Region::whole(id)];
    engine.acquire(&whole, Access::ReadOnly, stream).map_err(err("Engine::acquire"))?;
    let bare = (|| {
        device.synchronize_stream(stream).map_err(err("cuStreamSynchronize"))?;
        for i in 0..WARMUP + iters {
            let at = rng.random_range(0..slots) * K32;
            let t0 = Instant::now();
            // SAFETY: as above; the buffer is acquired, so its device bytes are mapped and resident.
            unsafe { device.copy_to_host_async(staging, va + at as u64, K32, stream) }
                .map_err(err("cuMemcpyDtoHAsync"))?;
            device.synchronize_stream(stream).map_err(err("cuStreamSynchronize"))?;
            let t1 = Instant::now();
            // SAFETY: the copy has completed; the staging is at least 32 KiB.
            let copied = unsafe { std::slice::from_raw_parts(staging as *const u8, K32) };
            mismatches += u64::from(pattern::first_mismatch(STEP_SEED, at, copied).is_some());
            let t2 = Instant::now();
            device.synchronize_stream(stream).map_err(err("cuStreamSynchronize"))?;
            if i >= WARMUP {
                t[TOTAL + 1].push((t1 - t0).as_secs_f64() * 1e6);
                t[TOTAL + 2].push(us_since(t2));
            }
        }
        Ok::<_, String>(())
    })();
    let released = engine.release(&whole, stream).map_err(err("Engine::release"));
    bare.and(released)?;
    Ok((t.map(Lat::of), mismatches))
}

/// Opens and fills a store, times its single-thread 32 KiB reads and the steps, then runs
/// `more` on the same store; the figures compared with and without learned loops.
fn section(
    size: u64,
    ops: usize,
    learn: bool,
    bad: &mut u64,
    more: impl FnOnce(&VramStore, &mut u64) -> Result<(), String>,
) -> Result<(Map<String, Value>, VramStore), String> {
    let label = if learn { "learn_loops on" } else { "learn_loops off" };
    let (store, learn_loops) = open(size, learn)?;
    let info = store.engine().device_info();
    if learn {
        eprintln!(
            "bench swap-store: {} (driver {}), {ops} timed requests of each kind",
            info.name, info.driver_version
        );
    }
    if learn && info.backend == BackendKind::Sim {
        eprintln!(
            "bench swap-store: SIMULATED DEVICE ({}) — these numbers are not evidence of speed",
            store.engine().fallback_reason().unwrap_or("TIERMEM_BACKEND=sim")
        );
    }
    let fill_gbps = fill(&store)?;
    let resident = store.stats().hbm_bytes as f64 / size as f64;
    let size_text = tiermem::format_size(size as usize);
    eprintln!("[{label}] {size_text} written at {fill_gbps:.1} GB/s, {:.0}% of it in HBM", resident * 100.0);
    if resident < 1.0 {
        eprintln!("  WARNING: not all of the device is in HBM: reads of the rest page in first");
    }
    let mut m = Map::new();
    m.insert("learn_loops_bytes".into(), json!(learn_loops));
    m.insert("fill_GBps".into(), json!(fill_gbps));
    m.insert("hbm_resident_fraction".into(), json!(resident));
    let (lat, b) = series(&store, false, K32, WARMUP, ops, SEED ^ 32)?;
    let read32k = Lat::of(lat);
    read32k.put(&mut m, "read32k_lat", true);
    eprintln!(
        "  [{label}] 32 KiB reads, 1 thread: {:.2} µs mean, {:.2} p50, {:.2} p99 (target ≤ {TARGET_US})",
        read32k.mean, read32k.p50, read32k.p99
    );
    let (steps, b2) = steps(&store, ops)?;
    *bad += b + b2;
    for (name, lat) in STEPS.iter().zip(&steps) {
        lat.put(&mut m, name, false);
    }
    let overhead = read32k.p50 - steps[TOTAL].p50;
    m.insert("store_overhead_us_p50".into(), json!(overhead));
    let p50s: Vec<String> = STEPS.iter().zip(&steps).map(|(name, lat)| format!("{name} {:.2}", lat.p50)).collect();
    eprintln!("  [{label}] p50 µs: {}; store overhead {overhead:.2}", p50s.join(", "));
    more(&store, bad)?;
    Ok((m, store))
}

pub fn run(dir: &Path, commit: &str, size: usize, ops: usize) -> Result<(), String> {
    let size = size as u64 / PAGE * PAGE;
    if size < K32 as u64 {
        return Err(format!("bench swap-store: --size {size} is less than one 32 KiB request"));
    }
    let ops = ops.max(1);
    let mut bad = 0;
    let mut singles = Map::new();
    let mut eight = (Lat::of(Vec::new()), 0.0);
    let (on, store) = section(size, ops, true, &mut bad, |store, bad| {
        for (name, write, len) in [("read4k", false, K4), ("write4k", true, K4)] {
            let (lat, b) = series(store, write, len, WARMUP, ops, SEED ^ len as u64 ^ u64::from(write))?;
            *bad += b;
            let lat = Lat::of(lat);
            eprintln!("  {name}, 1 thread: {:.2} µs mean, {:.2} p50, {:.2} p99", lat.mean, lat.p50, lat.p99);
            lat.put(&mut singles, &format!("{name}_lat"), true);
        }
        let (lat, kops, b) = threaded(store, ops)?;
        *bad += b;
        eprintln!(
            "  32 KiB reads, {THREADS} threads: {:.2} µs p50, {:.2} p99, {kops:.1} k requests/s",
            lat.p50, lat.p99
        );
        eight = (lat, kops);
        let (woken, trip, b) = handed(store, ops.min(5000))?;
        *bad += b;
        eprintln!(
            "  32 KiB reads handed to a sleeping thread: {:.2} µs p50 in the store, {:.2} p50 round trip",
            woken.p50, trip.p50
        );
        woken.put(&mut singles, "read32k_woken_lat", true);
        trip.put(&mut singles, "read32k_handoff_rtt", true);
        Ok(())
    })?;
    let info = store.engine().device_info().clone();
    let simulated = info.backend == BackendKind::Sim;
    let stats_on = (store.stats(), format!("{}", store.engine().stats()));
    drop(store);
    let (off, store) = section(size, ops, false, &mut bad, |_, _| Ok(()))?;
    let stats_off = (store.stats(), format!("{}", store.engine().stats()));
    drop(store);
    let verified = bad == 0;
    eprintln!("bench swap-store: {bad} mismatched reads; verified: {verified}");

    let mut metrics = on.clone();
    metrics.extend(singles);
    eight.0.put(&mut metrics, "read32k_8threads_lat", false);
    metrics.insert("read32k_8threads_kops".into(), json!(eight.1));
    for (key, from) in [
        ("read32k_learn_off_lat_us_mean", "read32k_lat_us_mean"),
        ("read32k_learn_off_lat_us_p50", "read32k_lat_us_p50"),
        ("read32k_learn_off_lat_us_p99", "read32k_lat_us_p99"),
        ("step_acquire_learn_off_us_p50", "step_acquire_us_p50"),
    ] {
        metrics.insert(key.into(), off[from].clone());
    }
    metrics.insert("mismatches".into(), json!(bad));
    let date = today();
    let get = |m: &Map<String, Value>, key: &str| m[key].as_f64().unwrap_or(f64::NAN);
    let read32k = get(&on, "read32k_lat_us_p50");
    let ratios = json!({
        "read32k_p50_vs_target": read32k / TARGET_US,
        "read32k_p50_learn_off_vs_on": get(&off, "read32k_lat_us_p50") / read32k,
        "step_total_vs_read32k_p50": get(&on, "step_total_us_p50") / read32k,
    });
    let mut report = super::report("vramswap-store", commit, &date, &info, Value::Object(metrics), ratios, verified);
    if let Some(object) = report.as_object_mut() {
        object.insert("learn_loops_on".into(), Value::Object(on));
        object.insert("learn_loops_off".into(), Value::Object(off));
    }
    let detail = json!({
        "suite": "vramswap-store-detail",
        "commit": commit,
        "date": date,
        "backend": info.backend.to_string(),
        "simulated": simulated,
        "size_bytes": size,
        "ops": ops,
        "threads": THREADS,
        "ops_per_thread": (ops / THREADS).max(1),
        "warmup_ops": WARMUP,
        "alignment": "each request at a random offset aligned to its own size",
        "store_stats_learn_on": stats_on.0,
        "engine_stats_learn_on": stats_on.1,
        "store_stats_learn_off": stats_off.0,
        "engine_stats_learn_off": stats_off.1,
        "targets": { "read32k_lat_us_p50": TARGET_US },
    });
    super::write_report(dir, "vramswap-store", &date, commit, &report, &detail)?;
    if verified {
        Ok(())
    } else {
        Err("bench swap-store: verification failed (see above)".into())
    }
}
