//! The engine's side of the peer suite: tiermem's peer tier between two GPUs — page-out to
//! the lender's HBM and page-in from it against the raw NVLink copy, and how fast a lender
//! gets its memory back (clean: chunks that have another copy; dirty: chunks whose only copy
//! is on the lender, copied to the host first), every byte verified after each move; and a
//! kernel reading it where it lies in the lender's HBM (peer_in_place.rs).

use crate::bench::{median, raw};
use std::time::Instant;
use tiermem::mechanism::{pattern, StreamHandle, StreamPriority};
use tiermem::{Access, AllocOptions, BufferId, Engine, EngineConfig, PeerChoice, Region, Target, Tier};

const WARMUP: usize = 2;
const GIB: f64 = (1u64 << 30) as f64;

/// What the engine measured; `None` where it could not (said in `notes`).
#[derive(Debug, Default)]
pub struct EngineSide {
    pub page_in_from_peer_gbps: Option<f64>,
    pub page_out_to_peer_gbps: Option<f64>,
    pub in_place_read_gbps: Option<f64>,
    /// The same kernel over plain memory on the lender, mapped for the borrower.
    pub raw_in_place_read_gbps: Option<f64>,
    pub reclaim_ms_per_gib_clean: Option<f64>,
    pub reclaim_ms_per_gib_dirty: Option<f64>,
    /// The raw device-to-host copy of the same size in the same run, ms per GiB: what a dirty
    /// reclaim must copy at least.
    pub d2h_ms_per_gib: Option<f64>,
    pub verified: bool,
    pub notes: Vec<String>,
}

struct Run {
    engine: Engine,
    stream: StreamHandle,
    id: BufferId,
    size: usize,
    lender: usize,
    verified: bool,
}

impl Run {
    fn check<T>(what: &str, r: tiermem::Result<T>) -> Result<T, String> {
        r.map_err(|e| format!("bench peer ({what}): {e}"))
    }

    /// Written by a kernel, as far as the engine knows: its copies below are dropped.
    fn dirty(&self) -> Result<(), String> {
        let region = [Region::whole(self.id)];
        Self::check("acquire", self.engine.acquire(&region, Access::ReadWrite, self.stream))?;
        Self::check("release", self.engine.release(&region, self.stream))?;
        self.engine.device().synchronize_stream(self.stream).map_err(|e| format!("bench peer (sync): {e}"))
    }

    fn verify(&mut self, after: &str) -> Result<(), String> {
        let mut data = vec![0u8; self.size];
        Self::check("read", self.engine.read(self.id, 0, &mut data))?;
        if let Some(at) = pattern::first_mismatch(self.id.0, 0, &data) {
            eprintln!("bench peer: VERIFICATION FAILED after {after}: byte {at} differs");
            self.verified = false;
        }
        Ok(())
    }

    fn timed(&self, what: &str, op: impl FnOnce(&Engine) -> tiermem::Result<()>) -> Result<f64, String> {
        let t = Instant::now();
        Self::check(what, op(&self.engine))?;
        Ok(t.elapsed().as_secs_f64())
    }

    fn on_peer(&self) -> usize {
        self.engine.stats().tiers.get(Tier::Peer).map_or(0, |t| t.used_bytes)
    }

    /// The lender lends four times the buffer again.
    fn lend_all(&self) -> Result<(), String> {
        Self::check("set_peer_lending", self.engine.set_peer_lending(self.lender, 4 * self.size).map(drop))
    }
}

/// An engine on GPU `borrower` whose peer tier borrows from GPU `lender` only, with one
/// buffer of `size` bytes holding its pattern, resident.
pub struct PeerEngine(Run);

impl PeerEngine {
    pub fn open(borrower: usize, lender: usize, size: usize) -> Result<Self, String> {
        Self::open_with(borrower, lender, size, |_| {})
    }

    /// As [`PeerEngine::open`], with the engine's configuration changed by `adjust` (e.g.
    /// borrowed HBM readable in place, one link only).
    pub fn open_with(
        borrower: usize,
        lender: usize,
        size: usize,
        adjust: impl FnOnce(&mut EngineConfig),
    ) -> Result<Self, String> {
        let base = EngineConfig::from_env().map_err(|e| format!("bench peer: {e}"))?;
        let mut config = EngineConfig {
            device: borrower,
            peers: PeerChoice::Gpus(vec![lender]),
            hbm_limit: Some(2 * size),
            host_limit: Some(2 * size),
            sim_gpus: base.sim_gpus.max(borrower.max(lender) + 1),
            sim_hbm: 6 * size,
            ..base
        };
        adjust(&mut config);
        let engine = Engine::new(config).map_err(|e| format!("bench peer: {e}"))?;
        if engine.peer_lenders().is_empty() {
            return Err(format!("bench peer: GPU {lender} does not lend: {}", engine.peer_notes().join("; ")));
        }
        let stream = engine.device().create_stream(StreamPriority::High).map_err(|e| format!("bench peer: {e}"))?;
        let options = AllocOptions { name: Some("peer".into()), ..Default::default() };
        let (id, _) = Run::check("alloc", engine.alloc(size, options))?;
        let mut data = vec![0u8; size];
        pattern::fill(id.0, 0, &mut data);
        Run::check("write", engine.write(id, 0, &data))?;
        Ok(Self(Run { engine, stream, id, size, lender, verified: true }))
    }

    /// Whether the engine takes its lender for busy now (its traffic held).
    pub fn lender_seen_busy(&self) -> bool {
        self.0.engine.busy_lenders().contains(&self.0.lender)
    }

    /// Waits until the engine no longer takes its lender for busy (its lender watch reads
    /// NVML's utilisation, which lags by up to a second), at most `most`.
    pub fn wait_until_lender_idle(&self, most: std::time::Duration) -> Result<(), String> {
        let start = std::time::Instant::now();
        while self.lender_seen_busy() {
            if start.elapsed() > most {
                return Err(format!("bench peer: GPU {} still looks busy {most:?} after its job ended", self.0.lender));
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Ok(())
    }

    /// Pages the buffer out to the lender and back in (dirty before each page-out) until
    /// `stop` is set: the lender's HBM under NVLink traffic, as a borrower makes it. Returns
    /// the round trips made.
    pub fn traffic(&self, stop: &std::sync::atomic::AtomicBool) -> Result<usize, String> {
        let mut trips = 0;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            self.0.dirty()?;
            Run::check("page_out", self.0.engine.page_out(Target::Buffer(self.0.id)))?;
            Run::check("page_in", self.0.engine.page_in(Target::Buffer(self.0.id)))?;
            trips += 1;
        }
        Ok(trips)
    }
}

/// Measures tiermem's peer tier: page-out to the lender and page-in from it, then reclaims.
pub fn measure(engine: PeerEngine, reps: usize) -> Result<EngineSide, String> {
    let PeerEngine(mut run) = engine;
    let (id, size, lender) = (run.id, run.size, run.lender);
    let mut out = EngineSide::default();

    // Page-out to the lender and page-in from it, dirty before each page-out.
    let (mut ins, mut outs) = (Vec::new(), Vec::new());
    for rep in 0..reps + WARMUP {
        run.dirty()?;
        let o = run.timed("page_out", |e| e.page_out(Target::Buffer(id)))?;
        if run.on_peer() < size {
            return Err(format!(
                "bench peer: a page-out of {size} bytes put only {} on GPU {lender}'s HBM",
                run.on_peer()
            ));
        }
        let i = run.timed("page_in", |e| e.page_in(Target::Buffer(id)))?;
        if rep >= WARMUP {
            outs.push(o);
            ins.push(i);
        }
    }
    run.verify("page-in from the peer")?;
    let gb = size as f64 / 1e9;
    out.page_out_to_peer_gbps = Some(gb / median(outs));
    out.page_in_from_peer_gbps = Some(gb / median(ins));

    // A kernel reading the buffer where it lies in the lender's HBM.
    let borrower = run.engine.device().info().ordinal;
    let reads = {
        let PeerEngine(other) = PeerEngine::open_with(borrower, lender, size, |c| c.peer_in_place = true)?;
        crate::bench::peer_in_place::measure(&other.engine, other.id, size, lender, reps, other.stream)?
    };
    out.in_place_read_gbps = Some(reads.engine_gbps);
    out.raw_in_place_read_gbps = Some(reads.raw_gbps);
    if !reads.verified {
        eprintln!("bench peer: VERIFICATION FAILED: a kernel read wrong bytes in place");
        run.verified = false;
    }

    // Reclaim: clean (resident, its peer copy a spare) and dirty (its only copy on the peer).
    let per_gib = |s: f64| s * 1e3 * GIB / size as f64;
    let (mut clean, mut dirty) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        run.lend_all()?;
        run.dirty()?;
        Run::check("page_out", run.engine.page_out(Target::Buffer(id)))?;
        Run::check("page_in", run.engine.page_in(Target::Buffer(id)))?;
        clean.push(per_gib(run.timed("clean reclaim", |e| e.set_peer_lending(lender, 0).map(drop))?));
        run.verify("a clean reclaim")?;
        run.lend_all()?;
        run.dirty()?;
        Run::check("page_out", run.engine.page_out(Target::Buffer(id)))?;
        dirty.push(per_gib(run.timed("dirty reclaim", |e| e.set_peer_lending(lender, 0).map(drop))?));
        if run.on_peer() != 0 {
            return Err("bench peer: the lender did not get all its memory back".into());
        }
        run.verify("a dirty reclaim")?;
    }
    out.reclaim_ms_per_gib_clean = Some(median(clean));
    out.reclaim_ms_per_gib_dirty = Some(median(dirty));
    let ceilings = raw::measure(run.engine.device(), size, reps)?;
    out.d2h_ms_per_gib = Some(GIB / 1e9 / ceilings.d2h_gbps * 1e3);
    out.verified = run.verified;
    drop(run);
    Ok(out)
}

/// Page-in from the host tier along two links (multipath.rs) and along this GPU's alone.
pub struct Multipath {
    pub two_links_gbps: f64,
    pub one_link_gbps: f64,
    /// The share of the two-link page-in's chunks that came through the lender.
    pub lender_share: f64,
    /// Timed two-link page-ins that began with the lender taken for busy (its link unused).
    pub reps_lender_busy: usize,
    pub verified: bool,
}

/// Page-ins of the buffer from the host tier, timed, with the lender's link (`multipath`) or
/// without; the lender lends nothing while the buffer goes down (so it goes to the host
/// tier) and lends again before each timed page-in (so its link may be used).
fn page_in_from_host(
    borrower: usize,
    lender: usize,
    size: usize,
    reps: usize,
    multipath: bool,
) -> Result<(f64, f64, usize, bool), String> {
    let PeerEngine(mut run) = PeerEngine::open_with(borrower, lender, size, |c| c.multipath = multipath)?;
    let id = run.id;
    let (mut times, mut by_lender, mut copied, mut busy) = (Vec::new(), 0, 0, 0);
    for rep in 0..reps + WARMUP {
        Run::check("set_peer_lending", run.engine.set_peer_lending(lender, 0).map(drop))?;
        run.dirty()?;
        Run::check("page_out", run.engine.page_out(Target::Buffer(id)))?;
        run.lend_all()?;
        let before = run.engine.stats().transfers;
        busy += usize::from(rep >= WARMUP && run.engine.busy_lenders().contains(&lender));
        let t = run.timed("page_in", |e| e.page_in(Target::Buffer(id)))?;
        let after = run.engine.stats().transfers;
        if rep >= WARMUP {
            times.push(t);
            by_lender += after.by_neighbours - before.by_neighbours;
            copied += after.page_ins - before.page_ins;
        }
    }
    run.verify(if multipath { "a page-in along two links" } else { "a page-in along one link" })?;
    let share = by_lender as f64 / copied.max(1) as f64;
    Ok((size as f64 / 1e9 / median(times), share, busy, run.verified))
}

/// Measures page-in from the host tier along two links against one, same buffer, same run.
pub fn multipath(borrower: usize, lender: usize, size: usize, reps: usize) -> Result<Multipath, String> {
    let (two_links_gbps, lender_share, reps_lender_busy, two_ok) =
        page_in_from_host(borrower, lender, size, reps, true)?;
    let (one_link_gbps, _, _, one_ok) = page_in_from_host(borrower, lender, size, reps, false)?;
    Ok(Multipath { two_links_gbps, one_link_gbps, lender_share, reps_lender_busy, verified: two_ok && one_ok })
}
