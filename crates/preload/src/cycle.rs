//! Stage 3: paging within a step. A *cycle* is what the program launches between two of its
//! synchronizations (the quiesce points of migrate.rs); a training loop repeats the same one
//! every step. tiermem records each cycle's launches — the kernel's handle and the pointers the
//! scan found in its arguments (launch.rs) — and at the synchronization that ends it plans the
//! next one as the same: segments whose working set fits in the budget, with the moves to make
//! before each segment's first launch (segments.rs). The first segment's moves are made at the
//! synchronization itself (migrate.rs, in place of stage 2's hotness plan); each later one at a
//! *pause* tiermem makes before the segment's first launch is enqueued: the gate held
//! exclusively, the context waited for, the moves made as at a quiesce point.
//!
//! Following checks each launch against the recording: a different kernel at that index, or
//! more launches than recorded, ends following for the rest of the cycle (no more pauses; the
//! synchronization that ends it plans again from what was recorded meanwhile).
//!
//! Bounded: at most [`MAX_LAUNCHES`] launches and [`MAX_CYCLE_POINTERS`] pointers per cycle
//! are recorded (a longer cycle is not planned), [`MAX_POINTERS`] pointers and [`MAX_CHUNKS`]
//! chunks per launch.
//!
//! Locking: one mutex over the recording and the plan, held for a few pushes per launch and
//! never while calling the driver or taking another lock; planning reads the hotness index
//! (for extents), then the process state, each on its own.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::boundary::log;
use crate::hotness::{self, ChunkId};
use crate::placement::Tier;
use crate::process;
use crate::segments::{self, Cycle};

/// Launches recorded per cycle at most; a longer cycle is not planned.
pub const MAX_LAUNCHES: usize = 200_000;
/// Pointers recorded per launch at most (the first ones scanned).
pub const MAX_POINTERS: usize = 64;
/// Chunks a launch is taken to touch at most.
pub const MAX_CHUNKS: usize = 4096;
/// Pointers recorded per cycle at most (16 MiB of them); a cycle passing more is not planned.
pub const MAX_CYCLE_POINTERS: usize = 2 << 20;

/// The knobs (docs/transparent.md).
struct Config {
    enabled: bool,
    /// Budget left free by the plans, in bytes.
    margin: usize,
}

fn config() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| {
        let enabled = match std::env::var("TIERMEM_SEGMENTS").as_deref() {
            Err(_) | Ok("on" | "1" | "true" | "") => true,
            Ok("off" | "0" | "false") => false,
            Ok(other) => {
                log("TIERMEM_SEGMENTS", &format!("{other:?} is neither on nor off"), "segments on");
                true
            }
        };
        let margin = match std::env::var("TIERMEM_SEGMENT_MARGIN") {
            Err(_) => 0,
            Ok(text) => tiermem::parse_size(&text).unwrap_or_else(|why| {
                log("TIERMEM_SEGMENT_MARGIN", &why.to_string(), "no margin");
                0
            }),
        };
        Config { enabled, margin }
    })
}

/// Whether stage 3 is on (`TIERMEM_SEGMENTS`, default on; nothing without migration).
pub fn enabled() -> bool {
    config().enabled && crate::migrate::enabled()
}

/// The moves at one segment boundary.
#[derive(Debug, Default)]
pub struct Boundary {
    pub up: Vec<ChunkId>,
    pub down: Vec<ChunkId>,
}

impl Boundary {
    pub fn is_empty(&self) -> bool {
        self.up.is_empty() && self.down.is_empty()
    }
}

/// Launch index → the moves of the segment it begins (those with moves).
type Pauses = HashMap<usize, Arc<Boundary>>;

/// The plan for the cycle under way: the recorded kernels, and the boundaries with moves.
struct Following {
    functions: Vec<usize>,
    pauses: Pauses,
}

struct Cycles {
    /// The cycle being recorded: each launch's kernel, and its pointers (`pointers[offsets[i]..]`).
    functions: Vec<usize>,
    offsets: Vec<usize>,
    pointers: Vec<u64>,
    /// Launches since the cycle began (counted before each launch is enqueued).
    count: usize,
    plan: Option<Following>,
    following: bool,
}

static CYCLES: Mutex<Cycles> = Mutex::new(Cycles {
    functions: Vec::new(),
    offsets: Vec::new(),
    pointers: Vec::new(),
    count: 0,
    plan: None,
    following: false,
});

fn cycles() -> MutexGuard<'static, Cycles> {
    // Every change under the lock is a push or a counter: consistent after a panic.
    CYCLES.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The counters `--stats` reports.
static PAUSES: AtomicU64 = AtomicU64::new(0);
static PAUSE_NANOS: AtomicU64 = AtomicU64::new(0);
static PAUSE_CHUNKS: AtomicU64 = AtomicU64::new(0);
static FOLLOWED: AtomicU64 = AtomicU64::new(0);
static DIVERGED: AtomicU64 = AtomicU64::new(0);
static PLAN_NANOS: AtomicU64 = AtomicU64::new(0);

/// Before launch of kernel `f` is enqueued (no gate held): the moves of the segment it begins,
/// if the cycle is being followed and it begins one with moves.
pub fn before_launch(f: usize) -> Option<Arc<Boundary>> {
    if !enabled() {
        return None;
    }
    let mut c = cycles();
    let index = c.count;
    c.count += 1;
    if !c.following {
        return None;
    }
    let plan = c.plan.as_ref()?;
    if plan.functions.get(index) != Some(&f) {
        c.following = false;
        DIVERGED.fetch_add(1, Relaxed);
        return None;
    }
    plan.pauses.get(&index).cloned()
}

/// Records launch of kernel `f`, which passed the candidate pointers `words` (under the gate).
pub fn record(f: usize, words: &[u64]) {
    if !enabled() {
        return;
    }
    let mut c = cycles();
    if c.functions.len() > MAX_LAUNCHES {
        return;
    }
    if c.pointers.len() + words.len().min(MAX_POINTERS) > MAX_CYCLE_POINTERS {
        // Too long to plan: marked as more launches than recorded at most.
        c.functions.resize(MAX_LAUNCHES + 1, 0);
        return;
    }
    c.functions.push(f);
    let offset = c.pointers.len();
    c.offsets.push(offset);
    c.pointers.extend(words.iter().take(MAX_POINTERS));
}

/// Pauses taken, time in them, chunks moved at them.
pub fn paused(nanos: u64, chunks: u64) {
    PAUSES.fetch_add(1, Relaxed);
    PAUSE_NANOS.fetch_add(nanos, Relaxed);
    PAUSE_CHUNKS.fetch_add(chunks, Relaxed);
}

/// The program synchronized (a quiesce point): the cycle ends. Plans the next one from its
/// recording; the first segment's moves, to make now, if there is a plan (empty: nothing to
/// move, and stage 2's hotness plan stays out of the way).
pub fn cycle_ends() -> Option<Arc<Boundary>> {
    if !enabled() {
        return None;
    }
    let (functions, offsets, pointers) = {
        let mut c = cycles();
        // Two synchronizations in a row: not a cycle; the plan stays for the one under way.
        if c.count == 0 && c.functions.is_empty() {
            return None;
        }
        if c.following {
            let recorded = c.plan.as_ref().map_or(0, |p| p.functions.len());
            (if c.count == recorded { &FOLLOWED } else { &DIVERGED }).fetch_add(1, Relaxed);
        }
        c.count = 0;
        c.following = false;
        c.plan = None;
        let functions = std::mem::take(&mut c.functions);
        (functions, std::mem::take(&mut c.offsets), std::mem::take(&mut c.pointers))
    };
    if functions.is_empty() || functions.len() > MAX_LAUNCHES || pointers.is_empty() {
        return None;
    }
    let started = std::time::Instant::now();
    let words: Vec<&[u64]> = (0..offsets.len())
        .map(|i| &pointers[offsets[i]..offsets.get(i + 1).copied().unwrap_or(pointers.len())])
        .collect();
    let touched = hotness::launch_chunks(&words, MAX_CHUNKS);
    let Some(Ok(ordinal)) = process::current_gpu() else { return None };
    let planned = plan(ordinal, &touched);
    PLAN_NANOS.fetch_add(started.elapsed().as_nanos() as u64, Relaxed);
    let (first, pauses) = planned?;
    let mut c = cycles();
    // Launches of other threads since the cycle ended would shift the indices: no following.
    c.following = c.count == 0;
    c.plan = Some(Following { functions, pauses });
    Some(first)
}

/// The plan for a cycle whose launches touch `touched` on GPU `ordinal`: the first boundary's
/// moves, and the later boundaries with moves by launch index.
fn plan(ordinal: usize, touched: &[Vec<ChunkId>]) -> Option<(Arc<Boundary>, Pauses)> {
    let p = process::lock();
    let gpu = p.gpus.get(&ordinal).filter(|gpu| gpu.device.is_some() && gpu.chunk > 0)?;
    let (mut ids, mut dense, mut in_hbm) = (Vec::new(), HashMap::new(), Vec::new());
    for allocation in p.books.iter().filter(|a| a.ordinal == ordinal) {
        for (index, &(_, tier)) in allocation.chunks.iter().enumerate() {
            dense.insert((allocation.va, index), ids.len());
            ids.push((allocation.va, index));
            in_hbm.push(tier == Tier::Hbm);
        }
    }
    let resident = in_hbm.iter().filter(|&&h| h).count();
    let room = gpu.budget.saturating_sub(gpu.hbm_used) / gpu.chunk;
    let budget = (resident + room).saturating_sub(config().margin.div_ceil(gpu.chunk));
    drop(p);
    let launches: Vec<Vec<usize>> =
        touched.iter().map(|chunks| chunks.iter().filter_map(|id| dense.get(id).copied()).collect()).collect();
    let pinned = vec![false; ids.len()];
    let segments = segments::plan(&Cycle { launches: &launches, in_hbm: &in_hbm, pinned: &pinned, budget });
    let boundary = |s: &segments::Segment| Boundary {
        up: s.up.iter().map(|&i| ids[i]).collect(),
        down: s.down.iter().map(|&i| ids[i]).collect(),
    };
    let first = Arc::new(segments.first().map(boundary).unwrap_or_default());
    let pauses = segments.iter().skip(1).filter(|s| s.moves() > 0).map(|s| (s.start, Arc::new(boundary(s)))).collect();
    Some((first, pauses))
}

/// The counters: pauses, ns in them, chunks moved at them, cycles followed to the end, diverged,
/// ns spent planning.
pub fn counters() -> (u64, u64, u64, u64, u64, u64) {
    (
        PLAN_NANOS.load(Relaxed),
        PAUSES.load(Relaxed),
        PAUSE_NANOS.load(Relaxed),
        PAUSE_CHUNKS.load(Relaxed),
        FOLLOWED.load(Relaxed),
        DIVERGED.load(Relaxed),
    )
}
