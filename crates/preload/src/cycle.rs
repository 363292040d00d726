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
//! Several cycles a step (a program that synchronizes more than once per step) are told apart
//! by their kernel sequences: the next cycle is predicted as the one that followed the cycle
//! just ended the last two times ([`KEPT`] recordings and successors kept), else as that cycle
//! again (a one-off cycle does not change the prediction).
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

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::boundary::log;
use crate::hotness::{self, ChunkId};
use crate::placement::Tier;
use crate::process;
use crate::segments::{self, Cycle};
use crate::trial::{Mode, Trial};

/// Launches recorded per cycle at most; a longer cycle is not planned.
pub const MAX_LAUNCHES: usize = 200_000;
/// Pointers recorded per launch at most (the first ones scanned): a launch's parameters are at
/// most 32 KiB (the driver's limit), 4096 words, so none is cut. A lower bound would drop what
/// matters most: PyTorch's `multi_tensor_apply` (AdamW's step) passes up to 36 tensors' addresses
/// per list, parameters and gradients first, the optimizer's state last — state that no other
/// launch touches, and that the plan would then take for unused and send to the host.
pub const MAX_POINTERS: usize = 4096;
/// Chunks a launch is taken to touch at most.
pub const MAX_CHUNKS: usize = 4096;
/// Pointers recorded per cycle at most (16 MiB of them); a cycle passing more is not planned.
pub const MAX_CYCLE_POINTERS: usize = 2 << 20;

/// Launches either side of a launch whose pointers end its extents (hotness::launch_chunks).
/// Measured on the H200 (BENCHMARKS.md, seventeenth session): a training step at 0.7x its
/// peak took 0.98 s with the whole cycle's pointers, 0.71 s with 0 or 8, 0.80 s with 64 —
/// the allocator reuses memory within a step, and an extent cut at a block carved later out
/// of a tensor's memory left the rest of the tensor on the host for the kernels to read over
/// PCIe. Not 0: a pool allocated in one piece (XLA's) would have every extent run to its end.
pub const DEFAULT_EXTENT_WINDOW: usize = 8;

/// The knobs (docs/transparent.md).
struct Config {
    enabled: bool,
    /// Budget left free by the plans, in bytes.
    margin: usize,
    /// Which pointers end a launch's extents (hotness::launch_chunks): `None`, the whole cycle's.
    extent_window: Option<usize>,
    /// Whether frees kept mapped for a reuse are planned with the program's allocations
    /// (deferred.rs).
    plan_kept: bool,
    /// Whether stage 3 is on trial (trial.rs; `TIERMEM_STAGE3_TRIAL`).
    trial: bool,
}

fn config() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| {
        let enabled = crate::boundary::switch("TIERMEM_SEGMENTS", true);
        let plan_kept = crate::boundary::switch("TIERMEM_PLAN_KEPT", true);
        let trial = crate::boundary::switch("TIERMEM_STAGE3_TRIAL", true);
        let margin = match std::env::var("TIERMEM_SEGMENT_MARGIN") {
            Err(_) => 0,
            Ok(text) => tiermem::parse_size(&text).unwrap_or_else(|why| {
                log("TIERMEM_SEGMENT_MARGIN", &why.to_string(), "no margin");
                0
            }),
        };
        let extent_window = match std::env::var("TIERMEM_EXTENT_WINDOW").as_deref() {
            Err(_) | Ok("") => Some(DEFAULT_EXTENT_WINDOW),
            Ok("cycle") => None,
            Ok(text) => Some(text.trim().parse().unwrap_or_else(|_| {
                log(
                    "TIERMEM_EXTENT_WINDOW",
                    &format!("{text:?} is neither a number of launches nor cycle"),
                    &format!("using {DEFAULT_EXTENT_WINDOW}"),
                );
                DEFAULT_EXTENT_WINDOW
            })),
        };
        Config { enabled, margin, extent_window, plan_kept, trial }
    })
}

/// Whether stage 3 is on (`TIERMEM_SEGMENTS`, default on since chunks of 32 MiB made its
/// pauses cheaper than what they save, docs/transparent.md; nothing without migration).
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

/// The plan for the cycle under way: the recording it was made from, and the boundaries with moves.
struct Following {
    recording: Arc<Recording>,
    pauses: Pauses,
}

/// One cycle's launches: each one's kernel, and its pointers (`pointers[offsets[i]..]`).
#[derive(Default)]
struct Recording {
    functions: Vec<usize>,
    offsets: Vec<usize>,
    pointers: Vec<u64>,
}

impl Recording {
    /// Records launch of kernel `f` with the candidate pointers `words` (at most
    /// [`MAX_POINTERS`]); past [`MAX_LAUNCHES`] or [`MAX_CYCLE_POINTERS`], marks the cycle too
    /// long to plan instead.
    fn push(&mut self, f: usize, words: &[u64]) {
        if self.functions.len() > MAX_LAUNCHES {
            return;
        }
        if self.pointers.len() + words.len().min(MAX_POINTERS) > MAX_CYCLE_POINTERS {
            // Too long to plan: marked as more launches than recorded at most.
            self.functions.resize(MAX_LAUNCHES + 1, 0);
            return;
        }
        self.functions.push(f);
        self.offsets.push(self.pointers.len());
        self.pointers.extend(words.iter().take(MAX_POINTERS));
    }

    /// Its kernels' sequence, hashed: cycles with the same one are taken to be the same cycle.
    fn fingerprint(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        self.functions.hash(&mut hasher);
        hasher.finish()
    }

    /// The pointers of launch `i`.
    fn words(&self, i: usize) -> &[u64] {
        &self.pointers[self.offsets[i]..self.offsets.get(i + 1).copied().unwrap_or(self.pointers.len())]
    }
}

struct Cycles {
    /// The cycle being recorded.
    recording: Recording,
    /// Launches since the cycle began (counted before each launch is enqueued).
    count: usize,
    plan: Option<Following>,
    following: bool,
}

static CYCLES: Mutex<Cycles> = Mutex::new(Cycles {
    recording: Recording { functions: Vec::new(), offsets: Vec::new(), pointers: Vec::new() },
    count: 0,
    plan: None,
    following: false,
});

fn cycles() -> MutexGuard<'static, Cycles> {
    // Every change under the lock is a push or a counter: consistent after a panic.
    CYCLES.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Recordings kept (the latest of each kernel sequence), and successors remembered.
const KEPT: usize = 4;

/// Which cycle came after which: a step with several synchronizations is several cycles that
/// follow each other in turn, and the next cycle is predicted as the one that followed the
/// cycle just ended last time (else as the cycle just ended).
struct History {
    /// Fingerprint → the latest recording with it; most recently seen last.
    recordings: Vec<(u64, Arc<Recording>)>,
    /// Fingerprint → the fingerprint of the cycle after it, last time, and how many times in a
    /// row that one came after it.
    successors: Vec<(u64, u64, u32)>,
    last: Option<u64>,
}

static HISTORY: Mutex<History> = Mutex::new(History { recordings: Vec::new(), successors: Vec::new(), last: None });

impl History {
    /// Learns that `recording` just ended; the recording the next cycle is predicted to repeat,
    /// and the fingerprints of the cycle ended and of the one predicted.
    fn learn(&mut self, recording: Arc<Recording>) -> (Arc<Recording>, u64, u64) {
        let fingerprint = recording.fingerprint();
        self.recordings.retain(|(f, _)| *f != fingerprint);
        self.recordings.push((fingerprint, recording.clone()));
        if self.recordings.len() > KEPT {
            self.recordings.remove(0);
        }
        if let Some(previous) = self.last.replace(fingerprint) {
            let at = self.successors.iter().position(|s| s.0 == previous);
            let seen = at.map(|at| self.successors.remove(at)).filter(|s| s.1 == fingerprint).map_or(0, |s| s.2);
            self.successors.push((previous, fingerprint, seen.saturating_add(1)));
            if self.successors.len() > KEPT {
                self.successors.remove(0);
            }
        }
        // A successor seen once may be a one-off (a step that diverged): twice in a row, it is
        // the pattern.
        let next = self.successors.iter().find(|s| s.0 == fingerprint && s.2 >= 2).map(|s| s.1);
        let known = next.and_then(|next| self.recordings.iter().find(|(f, _)| *f == next).cloned());
        let (predicted, recording) = known.unwrap_or((fingerprint, recording));
        (recording, fingerprint, predicted)
    }
}

fn history() -> MutexGuard<'static, History> {
    // Every change under the lock is a few vector updates: consistent after a panic.
    HISTORY.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Whether a cycle is being followed (`Cycles::following`, mirrored for [`following`]).
static FOLLOWING: AtomicBool = AtomicBool::new(false);

/// Whether a cycle is being followed: its plan's pauses place the chunks. One atomic read.
pub fn following() -> bool {
    FOLLOWING.load(Relaxed)
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
    if plan.recording.functions.get(index) != Some(&f) {
        let recorded = plan.recording.functions.len();
        c.following = false;
        FOLLOWING.store(c.following, Relaxed);
        DIVERGED.fetch_add(1, Relaxed);
        crate::trace::event("diverged", || format!("\"launch\": {index}, \"recorded\": {recorded}"));
        return None;
    }
    plan.pauses.get(&index).cloned()
}

/// Whether the cycle the last synchronization ended was followed to its end: the program
/// repeats what it did, so what was recorded names what it will touch — the frees kept for a
/// reuse too (deferred.rs: they are planned, and kept from being given back, only then).
static LAST_FOLLOWED: AtomicBool = AtomicBool::new(false);

/// Whether the last cycle was followed to its end ([`LAST_FOLLOWED`]).
pub fn followed_last() -> bool {
    LAST_FOLLOWED.load(Relaxed)
}

/// The cycle the last synchronization ended and the one predicted next, by their kernels'
/// fingerprints, where known (deferred.rs keeps each cycle's allocation places apart).
static TOLD: Mutex<(Option<u64>, Option<u64>)> = Mutex::new((None, None));

fn told(ended: Option<u64>, next: Option<u64>) {
    *TOLD.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = (ended, next);
}

/// The cycle the last synchronization ended, and the one predicted to come next.
pub fn told_apart() -> (Option<u64>, Option<u64>) {
    *TOLD.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Launches counted since the cycle began (for the trace).
pub fn launches_so_far() -> usize {
    cycles().count
}

/// Records launch of kernel `f`, which passed the candidate pointers `words` (under the gate).
pub fn record(f: usize, words: &[u64]) {
    if enabled() {
        cycles().recording.push(f, words);
    }
}

/// Pauses taken, time in them, chunks moved at them.
pub fn paused(nanos: u64, chunks: u64) {
    PAUSES.fetch_add(1, Relaxed);
    PAUSE_NANOS.fetch_add(nanos, Relaxed);
    PAUSE_CHUNKS.fetch_add(chunks, Relaxed);
}

/// A plan made at a synchronization for the cycle that comes next.
pub struct Planned {
    /// The first segment's moves, to make now (empty: nothing to move, and stage 2's hotness
    /// plan stays out of the way).
    pub first: Arc<Boundary>,
    /// When the whole cycle has no moves and graph replays heated chunks this epoch (heat the
    /// cycle does not show), the chunks its launches touch: what stage 2 must leave where it
    /// is as it places that heat (migrate.rs), so that the next plan has nothing to undo.
    pub idle: Option<HashSet<ChunkId>>,
}

/// The program synchronized (a quiesce point): the cycle ends. Plans the next one from its
/// recording, if there is one to plan.
pub fn cycle_ends() -> Option<Planned> {
    if !enabled() {
        told(None, None);
        return None;
    }
    let (recording, launches, followed) = {
        let mut c = cycles();
        // Two synchronizations in a row: not a cycle; the plan stays for the one under way.
        if c.count == 0 && c.recording.functions.is_empty() {
            told(None, told_apart().1);
            return None;
        }
        let recorded = c.plan.as_ref().map_or(0, |p| p.recording.functions.len());
        LAST_FOLLOWED.store(c.following && c.count == recorded, Relaxed);
        if c.following {
            (if c.count == recorded { &FOLLOWED } else { &DIVERGED }).fetch_add(1, Relaxed);
            if c.count != recorded {
                let count = c.count;
                crate::trace::event("diverged", || format!("\"launch\": {count}, \"recorded\": {recorded}"));
            }
        }
        let (launches, followed) = (c.count, c.following && c.count == recorded);
        c.count = 0;
        c.following = false;
        FOLLOWING.store(c.following, Relaxed);
        c.plan = None;
        (std::mem::take(&mut c.recording), launches, followed)
    };
    // Timed only for the trial: a synchronization takes no lock for it otherwise.
    let seconds = if config().trial { since_last_cycle_ended() } else { 0.0 };
    if recording.functions.len() > MAX_LAUNCHES || recording.pointers.is_empty() {
        history().last = None;
        told(None, None);
        return None;
    }
    let started = std::time::Instant::now();
    let (recording, ended, predicted) = history().learn(Arc::new(recording));
    told(Some(ended), Some(predicted));
    let Some(Ok(ordinal)) = process::current_gpu() else { return None };
    // Scanned with every chunk in HBM and within the budget (hotness::scan_always): learned,
    // so that a cut is planned by it; nothing to plan now.
    let over = process::budget_and_use(ordinal).is_some_and(|(budget, used)| used > budget);
    if !hotness::watching() && !over {
        return None;
    }
    // Stage 3 on trial (trial.rs): a cycle left to stage 2 is recorded, not planned.
    if trial_ended(seconds, launches, followed) == Mode::Hotness {
        return None;
    }
    let words: Vec<&[u64]> = (0..recording.offsets.len()).map(|i| recording.words(i)).collect();
    let touched = hotness::launch_chunks(&words, MAX_CHUNKS, config().extent_window);
    let planned = plan(ordinal, &touched);
    PLAN_NANOS.fetch_add(started.elapsed().as_nanos() as u64, Relaxed);
    let (first, pauses) = planned?;
    // Built only when replays need it: a sync of a program that fits pays nothing for it.
    let idle =
        (first.is_empty() && pauses.is_empty() && hotness::replayed()).then(|| touched.into_iter().flatten().collect());
    let mut c = cycles();
    // Launches of other threads since the cycle ended would shift the indices: no following.
    c.following = c.count == 0;
    FOLLOWING.store(c.following, Relaxed);
    c.plan = Some(Following { recording, pauses });
    Some(Planned { first, idle })
}

/// Stage 3's trial (trial.rs), and when the last cycle ended.
static TRIAL: Mutex<(Trial, Option<std::time::Instant>)> = Mutex::new((Trial::new(), None));

fn trial() -> MutexGuard<'static, (Trial, Option<std::time::Instant>)> {
    // Every change under the lock is a few fields: consistent after a panic.
    TRIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Seconds since the last cycle ended (0 for the first), and now the last.
fn since_last_cycle_ended() -> f64 {
    let now = std::time::Instant::now();
    trial().1.replace(now).map_or(0.0, |last| now.duration_since(last).as_secs_f64())
}

/// A cycle that mattered ended (the program over its budget): `seconds` long, `launches`
/// launched, `followed` to its end. The mode for the next one; stage 3 throughout with
/// `TIERMEM_STAGE3_TRIAL=off`.
fn trial_ended(seconds: f64, launches: usize, followed: bool) -> Mode {
    if !config().trial {
        return Mode::Segments;
    }
    let mut guard = trial();
    let ran = guard.0.mode();
    let next = guard.0.ended(seconds, launches, followed);
    if next != ran {
        let (kept, chose) = (guard.0.kept_segments, guard.0.chose_hotness);
        crate::trace::event("trial", || {
            format!("\"next\": \"{next:?}\", \"kept_segments\": {kept}, \"chose_hotness\": {chose}")
        });
    }
    next
}

/// `--stats`: what stage 3's trials chose, once one has.
pub fn trial_report() -> Option<String> {
    let guard = trial();
    let (kept, chose) = (guard.0.kept_segments, guard.0.chose_hotness);
    (kept + chose > 0).then(|| {
        format!(
            "tiermem: stats: stage 3 on trial: kept {kept} time(s), set aside for stage 2 alone {chose} time(s), {} now",
            if guard.0.mode() == Mode::Segments { "following cycles" } else { "stage 2 alone" }
        )
    })
}

/// The plan for a cycle whose launches touch `touched` on GPU `ordinal`: the first boundary's
/// moves, and the later boundaries with moves by launch index.
fn plan(ordinal: usize, touched: &[Vec<ChunkId>]) -> Option<(Arc<Boundary>, Pauses)> {
    let p = process::lock();
    let gpu = p.gpus.get(&ordinal).filter(|gpu| gpu.device.is_some() && gpu.chunk > 0)?;
    let (mut ids, mut dense, mut in_hbm, mut pinned, mut sizes) =
        (Vec::new(), HashMap::new(), Vec::new(), Vec::new(), Vec::new());
    // Frees kept for a reuse too, while the program repeats its cycles: the cycle's pointers
    // name them, and the next cycle's allocations take them back at the same addresses
    // (deferred.rs). A program whose cycles diverge (shapes that change from step to step)
    // would have them moved for nothing: on the H200, 3.4 s a step against 0.43.
    let kept = p.books.kept().filter(|_| config().plan_kept && followed_last());
    for allocation in p.books.iter().chain(kept).filter(|a| a.ordinal == ordinal) {
        for (index, &(_, tier)) in allocation.chunks.iter().enumerate() {
            dense.insert((allocation.va, index), ids.len());
            ids.push((allocation.va, index));
            in_hbm.push(tier == Tier::Hbm);
            // Shared with other processes (ipc.rs): never moved.
            pinned.push(allocation.shared);
            sizes.push(allocation.chunk_len(index));
        }
    }
    // In bytes: what the chunks hold in HBM and the room left, which may be negative (a budget
    // the node daemon lowered: the first segment sheds it). The rest of the HBM in use
    // (small allocations left to the driver; kept frees with `TIERMEM_PLAN_KEPT=off`) stays
    // out of reach.
    let resident: usize = (0..ids.len()).filter(|&c| in_hbm[c]).map(|c| sizes[c]).sum();
    let fits = (resident as i128 + gpu.budget as i128 - gpu.hbm_used as i128).max(0) as usize;
    let budget = fits.saturating_sub(config().margin);
    drop(p);
    let launches: Vec<Vec<usize>> =
        touched.iter().map(|chunks| chunks.iter().filter_map(|id| dense.get(id).copied()).collect()).collect();
    let cycle = Cycle { launches: &launches, in_hbm: &in_hbm, pinned: &pinned, sizes: &sizes, budget };
    let segments = segments::plan(&cycle);
    crate::trace::event("plan", || {
        let list = |items: &mut dyn Iterator<Item = String>| items.collect::<Vec<_>>().join(",");
        format!(
            "\"budget\": {budget}, \"ids\": [{}], \"in_hbm\": [{}], \"sizes\": [{}], \"launches\": [{}], \"segments\": [{}]",
            list(&mut ids.iter().map(|(va, i)| format!("[{va}, {i}]"))),
            list(&mut in_hbm.iter().map(|&h| u8::from(h).to_string())),
            list(&mut sizes.iter().map(usize::to_string)),
            list(&mut launches.iter().map(|l| format!("[{}]", list(&mut l.iter().map(usize::to_string))))),
            list(&mut segments.iter().map(|s| format!("[{}, {}, {}]", s.start, s.up.len(), s.down.len()))),
        )
    });
    crate::trace::event("plan_moves", || {
        let list = |items: &[usize]| items.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
        let each: Vec<String> =
            segments.iter().map(|s| format!("[{}, [{}], [{}]]", s.start, list(&s.up), list(&s.down))).collect();
        format!("\"segments\": [{}]", each.join(","))
    });
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cycle(functions: &[usize]) -> Arc<Recording> {
        Arc::new(Recording { functions: functions.to_vec(), offsets: vec![0; functions.len()], pointers: Vec::new() })
    }

    /// What `learn` predicts after each cycle of `sequence` ends (by the first kernel).
    fn predictions(sequence: &[&[usize]]) -> Vec<usize> {
        let mut history = History { recordings: Vec::new(), successors: Vec::new(), last: None };
        sequence.iter().map(|&functions| history.learn(cycle(functions)).0.functions[0]).collect()
    }

    #[test]
    fn a_launch_keeps_every_pointer_it_passed() {
        // AdamW's multi_tensor_apply: four lists of 36 addresses, the optimizer's state last.
        let words: Vec<u64> = (0..144).map(|i| 0x7000_0000_0000 + (i << 21)).collect();
        let mut recording = Recording::default();
        recording.push(9, &[1, 2]);
        recording.push(7, &words);
        assert_eq!((recording.words(0), recording.words(1)), (&[1, 2][..], &words[..]));
        let mut full = Recording::default();
        for _ in 0..=MAX_CYCLE_POINTERS / MAX_POINTERS {
            full.push(1, &[5; MAX_POINTERS]);
        }
        assert!(full.functions.len() > MAX_LAUNCHES, "a cycle passing too many pointers is marked too long");
    }

    #[test]
    fn the_next_cycle_is_the_one_that_followed_twice_else_the_same() {
        let (a, b, c): (&[usize], &[usize], &[usize]) = (&[1, 2], &[3], &[4, 4]);
        assert_eq!(predictions(&[a, a, a]), [1, 1, 1], "one cycle a step");
        assert_eq!(predictions(&[a, b, a, b, a, b]), [1, 3, 1, 3, 3, 1], "two a step, told apart from the fifth");
        assert_eq!(predictions(&[a, a, c, a, a]), [1, 1, 4, 1, 1], "a one-off cycle changes nothing");
    }
}
