//! The peer suite (issue 12): tiermem's peer tier between two GPUs against the raw NVLink
//! copy measured in the same run, how fast a lender gets its memory back, and what lending
//! costs the lender's own work. Every copy is verified.
//!
//! The raw ceiling copies between a plain allocation on the borrower and chunks created on
//! the lender and mapped into the borrower's address space with access set once (what the
//! peer tier's slabs are), on one stream, timed with events. The lender's job is a kernel
//! writing a few GiB on the lender over and over for a few seconds, timed alone and while the
//! borrower pages a buffer out to the lender and back in without pause: with tiermem's
//! default hold on a busy lender's traffic (`TIERMEM_PEER_BUSY_RATE`), and with none.

use super::peer_engine::{self, PeerEngine};
use super::{median, report, today, write_report};
use serde_json::json;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use tiermem::mechanism::{self, ChunkLocation, Device, DevicePtr, PhysHandle, StreamHandle, StreamPriority};
use tiermem::EngineConfig;

const WARMUP: usize = 2;
const SEED: u64 = 0x9ee7;

pub struct Setup {
    pub borrower: usize,
    pub lender: usize,
    pub size: usize,
    pub reps: usize,
    /// Bytes the lender's job writes per pass.
    pub job_bytes: usize,
    /// Seconds each run of the lender's job is timed, after up to a second of warm-up.
    pub job_seconds: f64,
    /// The torch benchmark's script: its dense decode is run with and without the peer tier.
    pub decode: Option<std::path::PathBuf>,
}

/// What the torch benchmark's dense decode gave in a process of its own.
struct Decode {
    tiermem_tok_s: f64,
    resident_tok_s: f64,
    identical: bool,
}

/// Runs the `inference` part of the torch benchmark (`script`) with `TIERMEM_PEERS=peers`:
/// its Llama, twice the HBM cap, decoded resident and through tiermem on GPU 0; `in_place`:
/// parameters in the peer tier are read where they lie.
fn torch_decode(script: &Path, peers: &str, in_place: bool) -> Result<Decode, String> {
    let dir = std::env::temp_dir().join(format!("tiermem-peer-decode-{}-{peers}-{in_place}", std::process::id()));
    let status = std::process::Command::new("python3")
        .arg(script)
        .arg("--json")
        .arg(&dir)
        .args(["--commit", "decode", "--parts", "inference"])
        .args(in_place.then_some("--in-place"))
        .env("TIERMEM_PEERS", peers)
        .env("TIERMEM_PEER_IN_PLACE", if in_place { "on" } else { "off" })
        .status()
        .map_err(|e| format!("bench peer: python3 {}: {e}", script.display()))?;
    let report = std::fs::read_dir(&dir).ok().and_then(|entries| {
        entries.filter_map(|e| e.ok().map(|e| e.path())).find(|p| p.to_string_lossy().ends_with("-decode.json"))
    });
    let parsed = report
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
    let _ = std::fs::remove_dir_all(&dir);
    let Some(json) = parsed.filter(|_| status.success()) else {
        return Err(format!("bench peer: the torch benchmark's decode with TIERMEM_PEERS={peers} failed ({status})"));
    };
    let metric = |key: &str| {
        json["metrics"][key].as_f64().ok_or_else(|| format!("bench peer: no {key} in the torch benchmark's report"))
    };
    Ok(Decode {
        tiermem_tok_s: metric("tiermem_decode_tok_s")?,
        resident_tok_s: metric("resident_decode_tok_s")?,
        identical: json["checks"]["tiermem_tokens_and_logits_identical"].as_bool() == Some(true),
    })
}

fn err(what: &'static str) -> impl Fn(mechanism::DeviceError) -> String {
    move |e| format!("bench peer ({what}): {e}")
}

/// `size` bytes of chunks created on GPU `lender`, mapped at one range of `device`'s with
/// access from it: a slab as the peer tier makes them.
struct PeerRange<'a> {
    device: &'a dyn Device,
    va: DevicePtr,
    size: usize,
    chunks: Vec<PhysHandle>,
}

impl<'a> PeerRange<'a> {
    fn new(device: &'a dyn Device, lender: usize, size: usize) -> Result<Self, String> {
        let g = device.info().granularity;
        let va = device.reserve(size).map_err(err("reserve"))?;
        let mut range = Self { device, va, size, chunks: Vec::new() };
        for i in 0..size / g {
            let chunk = device.create_chunk_at(ChunkLocation::Gpu(lender)).map_err(err("cuMemCreate on the lender"))?;
            range.chunks.push(chunk);
            device.map(va + (i * g) as u64, chunk).map_err(err("map"))?;
        }
        device.set_access_from(va, size, &[device.info().ordinal]).map_err(err("set access"))?;
        Ok(range)
    }
}

impl Drop for PeerRange<'_> {
    fn drop(&mut self) {
        let g = self.device.info().granularity;
        for i in 0..self.chunks.len() {
            let _ = self.device.unmap(self.va + (i * g) as u64, g);
        }
        self.chunks.iter().for_each(|&c| drop(self.device.release_chunk(c)));
        let _ = self.device.unreserve(self.va, self.size);
    }
}

/// Median seconds of `enqueue` on `stream`, timed with events.
fn timed(
    d: &dyn Device,
    stream: StreamHandle,
    reps: usize,
    enqueue: impl Fn() -> Result<(), String>,
) -> Result<f64, String> {
    let watch = Stopwatch::new(d)?;
    let mut samples = Vec::new();
    for rep in 0..reps + WARMUP {
        let seconds = watch.time(d, stream, &enqueue)?;
        if rep >= WARMUP {
            samples.push(seconds);
        }
    }
    watch.destroy(d)?;
    Ok(median(samples))
}

/// Two events that time work on a stream.
struct Stopwatch {
    start: mechanism::EventHandle,
    end: mechanism::EventHandle,
}

impl Stopwatch {
    fn new(d: &dyn Device) -> Result<Self, String> {
        Ok(Self {
            start: d.create_event(true).map_err(err("event"))?,
            end: d.create_event(true).map_err(err("event"))?,
        })
    }

    /// Seconds the work `enqueue` queues on `stream` takes on the device.
    fn time(
        &self,
        d: &dyn Device,
        stream: StreamHandle,
        enqueue: &dyn Fn() -> Result<(), String>,
    ) -> Result<f64, String> {
        d.record_event(self.start, stream).map_err(err("record"))?;
        enqueue()?;
        d.record_event(self.end, stream).map_err(err("record"))?;
        d.synchronize_event(self.end).map_err(err("synchronize"))?;
        Ok(f64::from(d.elapsed_ms(self.start, self.end).map_err(err("elapsed"))?) / 1e3)
    }

    fn destroy(self, d: &dyn Device) -> Result<(), String> {
        d.destroy_event(self.start).map_err(err("event"))?;
        d.destroy_event(self.end).map_err(err("event"))
    }
}

/// Whether the `size` bytes at `src` hold the pattern of `SEED`, checked on the device.
fn holds_pattern(d: &dyn Device, src: DevicePtr, size: usize, stream: StreamHandle) -> Result<bool, String> {
    let counter = d.alloc_plain(d.info().granularity).map_err(err("alloc"))?;
    d.memset_async(counter, 0, 8, stream).map_err(err("memset"))?;
    d.check_pattern_async(src, size / 8, SEED, 0, counter, stream).map_err(err("check"))?;
    d.synchronize_stream(stream).map_err(err("synchronize"))?;
    let mut wrong = [0u8; 4];
    d.read(counter, &mut wrong).map_err(err("read"))?;
    d.free_plain(counter).map_err(err("free"))?;
    Ok(u32::from_ne_bytes(wrong) == 0)
}

/// Raw copies between the borrower's HBM and the lender's, GB/s each way, and whether the
/// bytes came back intact.
fn raw_peer(d: &dyn Device, lender: usize, size: usize, reps: usize) -> Result<(f64, f64, bool), String> {
    let stream = d.create_stream(StreamPriority::High).map_err(err("stream"))?;
    let local = d.alloc_plain(size).map_err(err("alloc"))?;
    let peer = PeerRange::new(d, lender, size)?;
    d.fill_pattern_async(local, size / 8, SEED, 0, stream).map_err(err("fill"))?;
    let copy = |dst, src| d.copy_between_devices_async(dst, src, size, stream).map_err(err("copy"));
    let to_peer = timed(d, stream, reps, || copy(peer.va, local))?;
    d.memset_async(local, 0, size, stream).map_err(err("memset"))?;
    let from_peer = timed(d, stream, reps, || copy(local, peer.va))?;
    let intact = holds_pattern(d, local, size, stream)?;
    drop(peer);
    d.free_plain(local).map_err(err("free"))?;
    d.destroy_stream(stream).map_err(err("stream"))?;
    let gb = size as f64 / 1e9;
    Ok((gb / to_peer, gb / from_peer, intact))
}

/// The lender's own job: GB/s of a kernel writing `bytes` on it, pass after pass: all bytes
/// over all kernel time in `seconds`, after up to a second of warm-up (the borrower's lender
/// watch sees a lender's program within its polls; a program runs longer than that).
fn lender_job(d: &dyn Device, bytes: usize, seconds: f64) -> Result<f64, String> {
    let stream = d.create_stream(StreamPriority::High).map_err(err("stream"))?;
    let buf = d.alloc_plain(bytes).map_err(err("alloc on the lender"))?;
    let timing =
        time_passes(d, stream, seconds, || d.fill_pattern_async(buf, bytes / 8, SEED, 0, stream).map_err(err("fill")));
    let intact = holds_pattern(d, buf, bytes, stream);
    d.free_plain(buf).map_err(err("free"))?;
    d.destroy_stream(stream).map_err(err("stream"))?;
    if !intact? {
        return Err("bench peer: the lender's job wrote wrong bytes".into());
    }
    match timing? {
        (0, _) => {
            Err(format!("bench peer: no pass of the lender's job finished in {seconds} s; give --job-seconds more"))
        }
        (passes, total) => Ok((passes * bytes) as f64 / 1e9 / total),
    }
}

/// Runs `pass` on `stream` over and over for up to a second of warm-up, then `seconds` more:
/// the passes of that time and their kernel time in seconds, timed with events.
fn time_passes(
    d: &dyn Device,
    stream: StreamHandle,
    seconds: f64,
    pass: impl Fn() -> Result<(), String>,
) -> Result<(usize, f64), String> {
    let watch = Stopwatch::new(d)?;
    let (warm_up, began) = (seconds.min(1.0), std::time::Instant::now());
    let (mut passes, mut total, mut outcome) = (0, 0.0, Ok(()));
    while began.elapsed().as_secs_f64() < warm_up + seconds {
        let warm = began.elapsed().as_secs_f64() < warm_up;
        match watch.time(d, stream, &pass) {
            Ok(s) if !warm => (passes, total) = (passes + 1, total + s),
            Ok(_) => {}
            Err(e) => {
                outcome = Err(e);
                break;
            }
        }
    }
    watch.destroy(d)?;
    outcome.map(|()| (passes, total))
}

/// The lender's job while `engine` pages to it without pause: its GB/s, the borrower's round
/// trips meanwhile, and whether the borrower saw the lender busy by the end.
fn lender_job_while_lending(
    lender: &dyn Device,
    engine: &PeerEngine,
    job_bytes: usize,
    seconds: f64,
) -> Result<(f64, usize, bool), String> {
    let stop = AtomicBool::new(false);
    let (lending, trips, seen_busy) = std::thread::scope(|scope| {
        let traffic = scope.spawn(|| engine.traffic(&stop));
        // Let the borrower's first slabs be made before timing.
        std::thread::sleep(std::time::Duration::from_millis(200));
        let lending = lender_job(lender, job_bytes, seconds);
        let seen_busy = engine.lender_seen_busy();
        stop.store(true, Ordering::Relaxed);
        (lending, traffic.join().unwrap_or_else(|_| Err("the borrower's traffic panicked".into())), seen_busy)
    });
    Ok((lending?, trips?, seen_busy))
}

pub fn run(dir: &Path, commit: &str, setup: Setup) -> Result<(), String> {
    let Setup { borrower, lender, size, reps, job_bytes, job_seconds, decode } = setup;
    if borrower == lender {
        return Err(format!("bench peer: --borrower and --lender are both GPU {lender}; name two GPUs"));
    }
    let base = EngineConfig::from_env().map_err(|e| e.to_string())?;
    let sim = mechanism::SimNode { gpus: base.sim_gpus.max(borrower.max(lender) + 1), hbm_per_gpu: 6 * size };
    let (device, fallback) = mechanism::open_in_node(base.backend, borrower, sim).map_err(err("open the borrower"))?;
    let simulated = device.info().backend == mechanism::BackendKind::Sim;
    if simulated {
        eprintln!(
            "bench peer: SIMULATED DEVICE ({}) — these numbers are not evidence of speed",
            fallback.as_deref().unwrap_or("TIERMEM_BACKEND=sim")
        );
    }
    if !device.peer_access(lender) {
        return Err(format!("bench peer: GPU {borrower} has no peer access to GPU {lender}"));
    }
    eprintln!("bench peer: raw copies between GPU {borrower} and GPU {lender}'s HBM");
    let (raw_to, raw_from, raw_ok) = raw_peer(device.as_ref(), lender, size, reps)?;
    let raw_gbps = raw_to.min(raw_from);

    eprintln!("bench peer: the lender's own job, alone and while GPU {borrower} pages to it");
    let (lender_device, _) = mechanism::open_in_node(base.backend, lender, sim).map_err(err("open the lender"))?;
    let alone = lender_job(lender_device.as_ref(), job_bytes, job_seconds)?;
    let unheld = PeerEngine::open_with(borrower, lender, size, |c| c.peer_busy_rate = None)?;
    let (unheld_lending, unheld_trips, _) =
        lender_job_while_lending(lender_device.as_ref(), &unheld, job_bytes, job_seconds)?;
    drop(unheld);
    let engine = PeerEngine::open(borrower, lender, size)?;
    let (lending, trips, seen_busy) =
        lender_job_while_lending(lender_device.as_ref(), &engine, job_bytes, job_seconds)?;
    drop(lender_device);
    // The lender's job is over: what follows measures an idle lender.
    engine.wait_until_lender_idle(std::time::Duration::from_secs(10))?;

    eprintln!("bench peer: tiermem's peer tier: page-out, page-in, reclaim");
    let engine_side = peer_engine::measure(engine, reps)?;
    eprintln!("bench peer: page-in from the host tier along GPU {lender}'s link too, and along GPU {borrower}'s alone");
    let paths = peer_engine::multipath(borrower, lender, size, reps)?;
    let (h2d_device, _) = mechanism::open_in_node(base.backend, borrower, sim).map_err(err("open the borrower"))?;
    let raw_h2d = super::raw::measure(&h2d_device, size, reps)?.h2d_gbps;
    drop(h2d_device);
    let (with_peers, in_place, host_only) = match &decode {
        Some(script) => {
            eprintln!("bench peer: the torch benchmark's decode on GPU 0: neighbours lending (copied in, and read in place), and host-only");
            let with_peers = torch_decode(script, "auto", false)?;
            (Some(with_peers), Some(torch_decode(script, "auto", true)?), Some(torch_decode(script, "off", false)?))
        }
        None => (None, None, None),
    };
    let in_place_tok = in_place.as_ref().map(|d| d.tiermem_tok_s);
    let peer_tok = with_peers.as_ref().map(|d| d.tiermem_tok_s);
    let host_tok = host_only.as_ref().map(|d| d.tiermem_tok_s);
    let resident_tok = with_peers.as_ref().map(|d| d.resident_tok_s);
    let decode_identical = [&with_peers, &in_place, &host_only].iter().all(|d| d.as_ref().is_none_or(|d| d.identical));
    let ratio = |v: Option<f64>, of: f64| v.map(|v| v / of);
    let metrics = json!({
        "raw_peer_GBps": raw_gbps,
        "raw_to_peer_GBps": raw_to,
        "raw_from_peer_GBps": raw_from,
        "page_in_from_peer_GBps": engine_side.page_in_from_peer_gbps,
        "page_out_to_peer_GBps": engine_side.page_out_to_peer_gbps,
        "in_place_read_GBps": engine_side.in_place_read_gbps,
        "raw_in_place_read_GBps": engine_side.raw_in_place_read_gbps,
        "reclaim_ms_per_GiB_clean": engine_side.reclaim_ms_per_gib_clean,
        "reclaim_ms_per_GiB_dirty": engine_side.reclaim_ms_per_gib_dirty,
        "d2h_ms_per_GiB": engine_side.d2h_ms_per_gib,
        "decode_tok_s_peer": peer_tok,
        "decode_tok_s_peer_in_place": in_place_tok,
        "decode_tok_s_host_only": host_tok,
        "decode_tok_s_resident": resident_tok,
        "multipath_h2d_GBps": paths.two_links_gbps,
        "single_link_page_in_from_host_GBps": paths.one_link_gbps,
        "raw_h2d_GBps": raw_h2d,
        "multipath_lender_share": paths.lender_share,
        "lender_job_GBps_alone": alone,
        "lender_job_GBps_lending": lending,
        "lender_slowdown": lending / alone,
        "lender_job_GBps_lending_unheld": unheld_lending,
        "lender_slowdown_unheld": unheld_lending / alone,
        "borrower_trips_per_s_lending": trips as f64 / job_seconds,
        "borrower_trips_per_s_lending_unheld": unheld_trips as f64 / job_seconds,
    });
    let ratios = json!({
        "page_in_peer": ratio(engine_side.page_in_from_peer_gbps, raw_from),
        "page_out_peer": ratio(engine_side.page_out_to_peer_gbps, raw_to),
        "in_place": engine_side.in_place_read_gbps.zip(engine_side.raw_in_place_read_gbps).map(|(e, r)| e / r),
        "reclaim_dirty_vs_d2h": engine_side.reclaim_ms_per_gib_dirty.zip(engine_side.d2h_ms_per_gib).map(|(r, c)| r / c),
        "decode_vs_host_only": peer_tok.zip(host_tok).map(|(p, h)| p / h),
        "decode_vs_resident": peer_tok.zip(resident_tok).map(|(p, r)| p / r),
        "decode_in_place_vs_host_only": in_place_tok.zip(host_tok).map(|(p, h)| p / h),
        "decode_in_place_vs_resident": in_place_tok.zip(resident_tok).map(|(p, r)| p / r),
        "multipath_vs_single": paths.two_links_gbps / raw_h2d,
        "multipath_vs_single_link_page_in": paths.two_links_gbps / paths.one_link_gbps,
        "lender_slowdown": lending / alone,
    });
    let mut notes = engine_side.notes.clone();
    if decode.is_none() {
        notes.push("decode_*: not asked for (--decode bench/torch_bench.py runs them)".into());
    }
    if simulated {
        notes.push("simulated device: not evidence of speed".into());
    }
    let verified = raw_ok && engine_side.verified && decode_identical && paths.verified;
    let date = today();
    let rep = report("peer", commit, &date, device.info(), metrics, ratios, verified);
    let detail = json!({
        "size": size, "reps": reps, "borrower": borrower, "lender": lender, "job_bytes": job_bytes,
        "job_seconds": job_seconds, "borrower_saw_the_lender_busy": seen_busy,
        "multipath_reps_with_the_lender_taken_for_busy": paths.reps_lender_busy,
        "borrower_round_trips_during_lender_job": trips, "borrower_round_trips_during_lender_job_unheld": unheld_trips,
        "simulated": simulated, "notes": notes,
    });
    println!("{}", serde_json::to_string_pretty(&rep).map_err(|e| e.to_string())?);
    write_report(dir, "peer", &date, commit, &rep, &detail)?;
    if !verified {
        return Err("bench peer: VERIFICATION FAILED (see above)".into());
    }
    Ok(())
}
