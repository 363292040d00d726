//! Migration at quiesce points: when the program synchronizes (gated.rs), chunks that launches
//! show to be hot come up from the host and cold ones go down, at the same addresses.
//!
//! # When
//!
//! A successful `cuCtxSynchronize`, `cuStreamSynchronize(_ptsz)` or `cuEventSynchronize` is a
//! quiesce point: the program waits anyway (PyTorch's `loss.item()` every step). One is *taken*
//! only if all of these hold, else it is *skipped* at the cost of a few atomic reads:
//! migration is on (`TIERMEM_MIGRATE`); some chunk is on the host; no other thread is
//! migrating; no stream capture is under way and the program made no green context
//! (gate.rs); the last evaluation was at least `TIERMEM_MIGRATE_INTERVAL_MS` ago (100 ms: a
//! program that synchronizes after every kernel pays the evaluation, ~1 ms for thousands of
//! chunks, at most ten times a second); and the plan for the epoch's heats (moves.rs) is not
//! empty. Each evaluation ends the hotness epoch.
//!
//! A program that never synchronizes (or rarely: a loop of kernels and asynchronous copies)
//! still gets quiesce points: once `TIERMEM_PAUSE_MS` (1000) have passed without one while
//! chunks are on the host and no cycle is being followed, the next launch first takes a *pause*
//! of tiermem's own (GPUswap's approach): launches held by the exclusive gate, the context
//! waited for, stage 2's moves made ([`pause_point`]; `--stats` counts them).
//!
//! With stage 3 on (cycle.rs), a quiesce point first ends the program's cycle and plans the
//! next; when there is a plan, its first segment's moves are made here ([`carry`]) instead of
//! the hotness plan's, whatever the interval — unless the whole plan moves nothing and graph
//! replays heated chunks this epoch (graphs.rs): the cycle cannot see those, so stage 2 places
//! them, the cycle's own chunks neither moving nor making room (the next plan has nothing to
//! undo). `carry` also makes the moves of the pauses stage 3
//! takes before a segment's first launch, under the same guards and the same gate.
//!
//! # How
//!
//! Holding the gate exclusively (no routed work is enqueued meanwhile), tiermem waits for the
//! context (`cuCtxSynchronize`: nothing in flight touches a chunk), then moves in rounds of at
//! most a batch each way (512 MiB by default): a round's chunks going down, and those coming up
//! into the HBM that earlier rounds freed (so the GPU never holds more than the budget and no
//! HBM chunk is created for them), a round's copies overlapping the remapping of the round
//! before (rounds.rs). Each move (remap.rs):
//!
//! 1. each new chunk gets its shadow, a mapping of its own opened once (shadows.rs);
//! 2. every chunk's bytes are copied from its address into its new chunk's shadow, and waited for;
//! 3. for each move the chunk's address is unmapped and the new chunk mapped there, then access
//!    is given a run of neighbouring addresses per call.
//!
//! A chunk is the unit that moves: 32 MiB by default (process.rs), since the VMM calls cost per
//! mapping. Any failure leaves that chunk where it was, its bytes intact: before step 3 nothing
//! the program sees has changed; in step 3 a failed map puts the old chunk back at the address.
//! Host chunks freed by moves up are kept as spares for the next moves down (creating a host
//! chunk costs ~0.7 ms per 2 MiB), up to the HBM in use (the most that can go down), until the
//! GPU's last allocation is freed; `--stats` says where the time went (remap.rs's phases).
//!
//! Locking: the migration state's mutex (one migration at a time), then the gate, then the
//! process state (process.rs), then the hotness index; the process lock is held through the
//! moves, so no allocation or free of the GPU's memory interleaves with them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, OnceLock, TryLockError};
use std::time::{Duration, Instant};

use crate::boundary::log;
use crate::cycle::Boundary;
use crate::hotness::{self, ChunkId, Heats};
use crate::moves::{self, Candidate, Plan};
use crate::placement::Tier;
use crate::process::{self, Process};
use crate::remap::{self, Phase};
use crate::rounds;
use crate::{gate, stats};

mod lent;
pub use lent::meet_lent;

/// Why a budget cut cannot be met with migration off.
const OFF: &str = "migration is off (TIERMEM_MIGRATE=off): chunks stay where they are";

/// Quiesce points a chunk that moved stays where it is, whatever its heat.
const COOLDOWN: u64 = 2;

/// Bytes moved each way per batch (and per quiesce point of stage 2) unless
/// `TIERMEM_MIGRATE_BATCH` gives a number of chunks.
const BATCH_BYTES: usize = 512 << 20;

/// Bytes that may come up into room the budget has free at one quiesce point of stage 2
/// (moves.rs), unless `TIERMEM_MIGRATE_BATCH` bounds them too: ~80 ms of copies on the H200.
const FILL_BYTES: usize = 4 << 30;

/// The knobs, read once from the environment (docs/transparent.md).
struct Config {
    enabled: bool,
    interval: Duration,
    /// Chunks per batch, if set.
    batch: Option<usize>,
    /// How long without a quiesce point before a launch takes a pause (`None`: never).
    pause_after: Option<u64>,
    /// How long a lowered budget waits for the program's own quiesce point ([`meet`]).
    shed_grace: Duration,
    /// Least time between two looks at the lenders' free memory (`TIERMEM_PEER_CHECK_MS`, ms).
    peer_check: u64,
}

impl Config {
    /// Chunks moved each way per batch on a GPU whose chunks are `chunk` bytes.
    fn batch(&self, chunk: usize) -> usize {
        self.batch.unwrap_or(BATCH_BYTES / chunk.max(1)).max(1)
    }

    /// Chunks that may come up into free room at one quiesce point of stage 2.
    fn fill(&self, chunk: usize) -> usize {
        self.batch.unwrap_or(FILL_BYTES / chunk.max(1)).max(1)
    }
}

fn config() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| {
        let number = |name: &str, default: u64| match std::env::var(name) {
            Err(_) => default,
            Ok(text) => text.trim().parse().unwrap_or_else(|_| {
                log(name, &format!("{text:?} is not a whole number"), &format!("using {default}"));
                default
            }),
        };
        let enabled = crate::boundary::switch("TIERMEM_MIGRATE", true);
        let interval = Duration::from_millis(number("TIERMEM_MIGRATE_INTERVAL_MS", 100));
        let batch = std::env::var("TIERMEM_MIGRATE_BATCH").is_ok().then(|| number("TIERMEM_MIGRATE_BATCH", 1) as usize);
        let pause_after = Some(number("TIERMEM_PAUSE_MS", 1000)).filter(|&ms| ms > 0);
        let shed_grace = Duration::from_millis(number("TIERMEM_SHED_GRACE_MS", 500));
        // The engine's lenders get memory back within 100 ms.
        let peer_check = number("TIERMEM_PEER_CHECK_MS", 100);
        Config { enabled, interval, batch, pause_after, shed_grace, peer_check }
    })
}

/// Whether migration is on (`TIERMEM_MIGRATE`, default on).
pub fn enabled() -> bool {
    config().enabled
}

#[derive(Default)]
struct State {
    last: Option<Instant>,
    evaluations: u64,
    /// Chunk address → the evaluation that last moved it.
    moved_at: HashMap<u64, u64>,
    /// The next evaluation brings up everything that fits, not [`FILL_BYTES`] (a turn begins).
    fill_all: bool,
    gpus: BTreeMap<usize, rounds::Tools>,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

/// The migration state, unless another thread holds it (migrating).
fn try_state() -> Option<MutexGuard<'static, Option<State>>> {
    match STATE.try_lock() {
        Ok(state) => Some(state),
        // A panic mid-migration left the books as far as the moves that succeeded: still valid.
        Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// Set while a GPU's HBM stays over a budget the node daemon lowered, which its link could not
/// shed (a stream capture was under way): the program's next quiesce point or pause sheds it,
/// chunks on the host or not.
static OVER_BUDGET: AtomicBool = AtomicBool::new(false);

/// Whether a quiesce point has anything to do: chunks on the host to bring up, or a budget to meet.
fn due() -> bool {
    hotness::watching() || OVER_BUDGET.load(Relaxed)
}

/// Whether any GPU's HBM is over its budget.
fn any_over(p: &Process) -> bool {
    p.gpus.values().any(|gpu| gpu.device.is_some() && gpu.room_chunks() < 0)
}

/// The counters `--stats` reports.
static TAKEN: AtomicU64 = AtomicU64::new(0);
static SKIPPED: AtomicU64 = AtomicU64::new(0);
static NANOS: AtomicU64 = AtomicU64::new(0);

/// Logs `why` migration stops, once per process.
pub fn stop(call: &str, why: &str) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if enabled() && !SAID.swap(true, Relaxed) {
        log(call, why, "chunks stay where they are from now on (said once)");
    }
}

/// A quiesce point: the program's synchronization `call` just succeeded (module documentation).
pub fn quiesce_point(call: &str) {
    if crate::deferred::any() {
        // As the driver's pool gives memory back at synchronizations, beyond its threshold.
        crate::deferred::reap(false);
        crate::deferred::trim(call, crate::pools::release_threshold);
    }
    let config = config();
    if !config.enabled {
        crate::deferred::cycle_ends(None, None);
        return;
    }
    LAST_QUIESCE_MS.store(now_ms(), Relaxed);
    crate::trace::event("sync", || format!("\"call\": {}", crate::trace::quoted(call)));
    lent::give_back_lent(call);
    // Stage 3 (cycle.rs): the cycle ends; with a plan for the next, its first segment's moves
    // are made here instead of the hotness plan's.
    let planned = crate::cycle::cycle_ends();
    let (ended, next) = crate::cycle::told_apart();
    crate::deferred::cycle_ends(ended, next);
    if !due() {
        return;
    }
    if let Some(crate::cycle::Planned { first, idle }) = planned {
        // Graph replays heat chunks that the cycle's launches do not show; with nothing for
        // stage 3 to move, stage 2 places them, leaving the cycle's chunks where they are.
        if let Some(cycle_chunks) = idle {
            return hotness_moves(call, config, Some(&cycle_chunks));
        }
        let started = Instant::now();
        // The epoch's heat is not used while segments place the chunks; it is kept for a later
        // quiesce point if they could not (a stream capture under way, another migration).
        match first.is_empty().then_some(0).or_else(|| carry(call, &first)) {
            Some(moved) => {
                drop(hotness::take_epoch());
                if moved > 0 {
                    TAKEN.fetch_add(1, Relaxed);
                    NANOS.fetch_add(started.elapsed().as_nanos() as u64, Relaxed);
                }
            }
            None => drop(SKIPPED.fetch_add(1, Relaxed)),
        }
        return;
    }
    hotness_moves(call, config, None);
}

/// Milliseconds since the first call, on a clock that only goes forward.
fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// When the last quiesce point (the program's synchronization or a pause) was ([`now_ms`]).
static LAST_QUIESCE_MS: AtomicU64 = AtomicU64::new(0);
static UNSYNCED_PAUSES: AtomicU64 = AtomicU64::new(0);

/// Whether a launch should first take a pause: the program has not synchronized for
/// `TIERMEM_PAUSE_MS` (1000) while chunks are on the host and no cycle is being followed
/// (stage 3's own pauses place the chunks then). A few atomic reads.
pub fn pause_due() -> bool {
    let config = config();
    let Some(after) = config.pause_after.filter(|_| config.enabled) else { return false };
    due() && !crate::cycle::following() && now_ms().saturating_sub(LAST_QUIESCE_MS.load(Relaxed)) >= after
}

/// A pause tiermem makes before launch `call` because the program has not synchronized for a
/// while (GPUswap's approach; module documentation): stage 2's moves, as at a quiesce point —
/// the gate held exclusively and the context waited for, so nothing in flight touches a chunk.
pub fn pause_point(call: &str) {
    let now = now_ms();
    // First come, first served: the other threads' launches see the pause as made.
    let last = LAST_QUIESCE_MS.load(Relaxed);
    if LAST_QUIESCE_MS.compare_exchange(last, now, Relaxed, Relaxed).is_err() {
        return;
    }
    UNSYNCED_PAUSES.fetch_add(1, Relaxed);
    // A program that never synchronizes: its pauses end its cycles (deferred.rs ages its frees).
    crate::deferred::cycle_ends(None, None);
    crate::trace::event("pause", || format!("\"call\": {}", crate::trace::quoted(call)));
    lent::give_back_lent(call);
    hotness_moves(call, config(), None);
}

/// A pause before the first launch after the program waited for its turn (turns.rs): what the
/// cut sent down while it waited is not cooling (it did not move for heat, and the turn is a
/// new budget), and everything that fits the turn's budget comes up now, before the launch,
/// not [`FILL_BYTES`] of it (the rest would be read in place for the rest of the step: on the
/// H200 12 GiB so read took a step of ~6 s against 0.23).
pub fn turn_begins(call: &str) {
    if let Some(mut state) = try_state() {
        let state = state.get_or_insert_with(State::default);
        state.moved_at.clear();
        state.last = None;
        state.fill_all = true;
    }
    pause_point(call);
}

/// Stage 2 at a quiesce point: the epoch's heat planned into moves (moves.rs) and made, unless
/// the interval since the last evaluation is too short or nothing would move. The chunks in
/// `stay` (a stage-3 cycle's) neither move nor make room.
fn hotness_moves(call: &str, config: &Config, stay: Option<&HashSet<ChunkId>>) {
    let Some(mut state) = try_state() else {
        SKIPPED.fetch_add(1, Relaxed);
        return;
    };
    let state = state.get_or_insert_with(State::default);
    let now = Instant::now();
    if gate::forbidden().is_some() || state.last.is_some_and(|last| now - last < config.interval) {
        SKIPPED.fetch_add(1, Relaxed);
        return;
    }
    state.last = Some(now);
    state.evaluations += 1;
    let heats = hotness::take_epoch();
    let Some(Ok(ordinal)) = process::current_gpu() else { return };
    if plan_for(&process::lock(), ordinal, &heats, state, stay).0.is_empty() {
        SKIPPED.fetch_add(1, Relaxed);
        return;
    }
    let _gate = gate::exclusive();
    let started = Instant::now();
    // A capture that began before the gate was taken makes a context synchronization illegal.
    let synced = gate::forbidden().is_none() && remap::timed(Phase::Wait, synchronize);
    if !synced {
        SKIPPED.fetch_add(1, Relaxed);
        return;
    }
    let mut p = process::lock();
    let (plan, ids) = plan_for(&p, ordinal, &heats, state, stay);
    state.fill_all = false;
    execute(call, &mut p, ordinal, &plan, &ids, state);
    OVER_BUDGET.store(any_over(&p), Relaxed);
    TAKEN.fetch_add(1, Relaxed);
    NANOS.fetch_add(started.elapsed().as_nanos() as u64, Relaxed);
}

/// Waits for the program's contexts (contexts.rs): whether it succeeded.
fn synchronize() -> bool {
    crate::contexts::synchronize()
}

/// The plan for GPU `ordinal`'s chunks but those in `stay`, and the chunk each id of it names.
fn plan_for(
    p: &Process,
    ordinal: usize,
    heats: &Heats,
    state: &State,
    stay: Option<&HashSet<ChunkId>>,
) -> (Plan, Vec<ChunkId>) {
    let Some(gpu) = p.gpus.get(&ordinal).filter(|gpu| gpu.device.is_some()) else { return Default::default() };
    let (mut candidates, mut ids) = (Vec::new(), Vec::new());
    // Shared allocations (ipc.rs) stay where they are: other processes map their chunks.
    for allocation in p.books.iter().filter(|a| a.ordinal == ordinal && !a.shared) {
        let heat = heats.get(&allocation.va);
        for (index, &(_, tier)) in allocation.chunks.iter().enumerate() {
            if stay.is_some_and(|stay| stay.contains(&(allocation.va, index))) {
                continue;
            }
            let address = allocation.chunk_va(index);
            let cooling = state.moved_at.get(&address).is_some_and(|&at| state.evaluations - at <= COOLDOWN);
            let heat = heat.and_then(|h| h.get(index)).copied().unwrap_or(0);
            candidates.push(Candidate { id: ids.len(), on_host: tier == Tier::Host, heat, cooling });
            ids.push((allocation.va, index));
        }
    }
    // Room in whole chunks: a short chunk counts as a whole one (execute checks the bytes).
    let plan = match usize::try_from(gpu.room_chunks()) {
        Ok(room) => {
            let fill = if state.fill_all { room } else { config().fill(gpu.chunk) };
            moves::plan(&candidates, room, config().batch(gpu.chunk), fill)
        }
        // A budget lowered under the HBM in use: met first.
        Err(_) => moves::shed(&candidates, gpu.room_chunks().unsigned_abs()),
    };
    (plan, ids)
}

/// Meets GPU `ordinal`'s budget, which the node daemon just lowered (lease.rs): the program's
/// own quiesce points get `TIERMEM_SHED_GRACE_MS` (500) to meet it — there, a cycle being
/// followed is planned again for the new budget, the chunks used furthest ahead going down,
/// where a cut mid-step sends down the chunks the rest of the step needs (those cold so far)
/// and its kernels read them over PCIe until the next synchronization (on the H200 a 0.23 s
/// step took 11.7 s) — then [`shed`] meets it from this thread: an idle program, or one that
/// never synchronizes, gives memory back too. Whether the budget is met, or why not.
pub fn meet(call: &str, ordinal: usize) -> Result<(), String> {
    // Async frees done with give their HBM back first (deferred.rs).
    if crate::deferred::any() {
        crate::deferred::reap(false);
        crate::deferred::trim(call, |_| 0);
    }
    let met = || process::lock().gpus.get(&ordinal).is_none_or(|gpu| gpu.room_chunks() >= 0);
    if config().enabled {
        // The program's next quiesce point evaluates even with nothing on the host.
        OVER_BUDGET.store(true, Relaxed);
        grace(met);
    }
    shed(call, ordinal)
}

/// Waits up to `TIERMEM_SHED_GRACE_MS` for the program's own quiesce points to meet a cut
/// (`met`); whether they did.
fn grace(met: impl Fn() -> bool) -> bool {
    let until = Instant::now() + config().shed_grace;
    while !met() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    met()
}

/// Runs `body` in a pause of tiermem's own on GPU `ordinal`, from a thread of its own, like
/// [`pause_point`]'s — after any migration under way, the GPU's primary context (the
/// program's) made current on this thread, the gate held exclusively, the context waited for
/// — so that a program that is idle, or never synchronizes, still moves; why not, if nothing
/// may move now.
fn own_pause<T>(ordinal: usize, body: impl FnOnce(&mut State) -> T) -> Result<T, String> {
    let mut state = STATE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let state = state.get_or_insert_with(State::default);
    let _context = crate::driver::PrimaryContext::bind(ordinal)?;
    let _gate = gate::exclusive();
    if let Some(why) = gate::forbidden() {
        return Err(format!("nothing may move now ({why}): the program's next synchronization moves it"));
    }
    if !remap::timed(Phase::Wait, synchronize) {
        return Err(format!("cuCtxSynchronize on GPU {ordinal} failed: nothing moved"));
    }
    Ok(body(state))
}

/// Sends GPU `ordinal`'s coldest chunks down until its HBM fits its budget, which the node
/// daemon just lowered (lease.rs), from a thread of tiermem's own: a pause like
/// [`pause_point`]'s — after any migration under way, the gate held exclusively, the GPU's
/// primary context (the program's, made current on this thread) waited for — so that a program
/// that is idle, or never synchronizes, still gives memory back. Whether the budget is met, or
/// why not.
pub fn shed(call: &str, ordinal: usize) -> Result<(), String> {
    if process::lock().gpus.get(&ordinal).is_none_or(|gpu| gpu.room_chunks() >= 0) {
        return Ok(());
    }
    if !config().enabled {
        return Err(OFF.into());
    }
    // Until it is met, the program's own quiesce points try too.
    OVER_BUDGET.store(true, Relaxed);
    let started = Instant::now();
    let (still_over, went_down) = own_pause(ordinal, |state| {
        let (heats, mut p, mut went_down) = (hotness::take_epoch(), process::lock(), 0);
        // Again while short chunks (an allocation's last) left it over and the last round moved some.
        let still_over = loop {
            state.evaluations += 1;
            let (plan, ids) = plan_for(&p, ordinal, &heats, state, None);
            let before = rounds::counts().1;
            execute(call, &mut p, ordinal, &plan, &ids, state);
            let moved = rounds::counts().1 - before;
            went_down += moved;
            let over = p.gpus.get(&ordinal).filter(|gpu| gpu.room_chunks() < 0).map(|gpu| (gpu.hbm_used, gpu.budget));
            if moved == 0 || over.is_none() {
                break over;
            }
        };
        OVER_BUDGET.store(any_over(&p), Relaxed);
        (still_over, went_down)
    })?;
    TAKEN.fetch_add(1, Relaxed);
    NANOS.fetch_add(started.elapsed().as_nanos() as u64, Relaxed);
    let ms = started.elapsed().as_secs_f64() * 1e3;
    crate::trace::event("shed", || format!("\"gpu\": {ordinal}, \"down\": {went_down}, \"ms\": {ms:.3}"));
    let Some((used, budget)) = still_over else { return Ok(()) };
    Err(format!(
        "{} of HBM still held over a budget of {} after {went_down} chunk(s) went down: the rest is in \
         chunks that failed to move (said above) or in small allocations the driver serves, which stay",
        tiermem::format_size(used),
        tiermem::format_size(budget),
    ))
}

/// Makes the moves of a segment boundary (cycle.rs), at a pause or at a quiesce point: as a
/// quiesce point does, under the same guards (another migration under way, a stream capture, a
/// green context of the program's: nothing moves), the gate held exclusively and the context
/// waited for; in batches. Moves that no longer apply (a chunk freed, or already where it would
/// go) are dropped. The chunks moved, or `None` if nothing could be done.
pub fn carry(call: &str, boundary: &Boundary) -> Option<u64> {
    let mut state = try_state()?;
    let state = state.get_or_insert_with(State::default);
    if gate::forbidden().is_some() {
        return None;
    }
    let Some(Ok(ordinal)) = process::current_gpu() else { return None };
    let _gate = gate::exclusive();
    let (started, phases) = (Instant::now(), remap::phases());
    // A capture that began before the gate was taken makes a context synchronization illegal.
    let synced = gate::forbidden().is_none() && remap::timed(Phase::Wait, synchronize);
    if !synced {
        return None;
    }
    let mut p = process::lock();
    state.evaluations += 1;
    let applies = |p: &Process, id: &ChunkId, tier: Tier| {
        let movable = p.books.movable(id.0).filter(|a| a.ordinal == ordinal && !a.shared);
        movable.and_then(|a| a.chunks.get(id.1)).is_some_and(|c| c.1 == tier)
    };
    let down: Vec<ChunkId> = boundary.down.iter().copied().filter(|id| applies(&p, id, Tier::Hbm)).collect();
    let up: Vec<ChunkId> = boundary.up.iter().copied().filter(|id| applies(&p, id, Tier::Host)).collect();
    let ids: Vec<ChunkId> = down.iter().chain(&up).copied().collect();
    let moves_so_far = || rounds::counts().0 + rounds::counts().1;
    let before = moves_so_far();
    let plan = Plan { down: (0..down.len()).collect(), up: (down.len()..ids.len()).collect() };
    execute(call, &mut p, ordinal, &plan, &ids, state);
    let moved = moves_so_far() - before;
    drop(p);
    crate::trace::event("moves", || {
        let spent: Vec<String> = (remap::phases().iter().zip(phases))
            .zip(crate::stats::PHASE_NAMES)
            .map(|((now, then), name)| format!("\"{name}\": {:.3}", (now.0 - then.0) as f64 / 1e6))
            .collect();
        format!(
            "\"call\": {}, \"up\": {}, \"down\": {}, \"moved\": {moved}, \"ms\": {:.3}, \"phases_ms\": {{{}}}",
            crate::trace::quoted(call),
            up.len(),
            down.len(),
            started.elapsed().as_secs_f64() * 1e3,
            spent.join(", ")
        )
    });
    Some(moved)
}

/// Carries out `plan` (whose indices name `ids`) on GPU `ordinal`, in pipelined rounds of at
/// most a batch each way (rounds.rs); notes when each chunk moved, for the cooldown.
fn execute(call: &str, p: &mut Process, ordinal: usize, plan: &Plan, ids: &[ChunkId], state: &mut State) {
    let Some(batch) = p.gpus.get(&ordinal).map(|gpu| config().batch(gpu.chunk)) else { return };
    let (downs, ups): (Vec<ChunkId>, Vec<ChunkId>) =
        (plan.down.iter().map(|&i| ids[i]).collect(), plan.up.iter().map(|&i| ids[i]).collect());
    let evaluation = state.evaluations;
    let tools = state.gpus.entry(ordinal).or_default();
    for address in rounds::execute(call, p, ordinal, &downs, &ups, tools, batch) {
        state.moved_at.insert(address, evaluation);
    }
    state.moved_at.retain(|_, &mut at| evaluation - at <= COOLDOWN);
}

/// Runs `f` on GPU `ordinal`'s moving tools (its spare host chunks) and the process state,
/// unless a migration holds them or the GPU has no allocation left (spares.rs hands over the
/// chunks it made ahead; [`release_if_idle`] would not see them after the last free).
pub fn with_tools<T>(ordinal: usize, f: impl FnOnce(&mut rounds::Tools, &mut Process) -> T) -> Option<T> {
    let mut state = try_state()?;
    let state = state.get_or_insert_with(State::default);
    let mut p = process::lock();
    if !p.books.iter().any(|a| a.ordinal == ordinal) {
        return None;
    }
    Some(f(state.gpus.entry(ordinal).or_default(), &mut p))
}

/// After a free on GPU `ordinal`: if none of its allocations is left, gives back the spare
/// chunks and the streams (so a program that frees everything holds nothing).
pub fn release_if_idle(ordinal: usize) {
    if process::lock().books.iter().any(|a| a.ordinal == ordinal) {
        return;
    }
    // The GPU's last free: it waits for a migration under way (which holds the state) to end,
    // holding no other lock meanwhile, so that the spares and streams never outlive the
    // allocations. (Not a free re-entered from a migration: those go straight to the driver.)
    let mut state = STATE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let Some(state) = state.as_mut().filter(|state| state.gpus.contains_key(&ordinal)) else { return };
    let mut p = process::lock();
    if p.books.iter().any(|a| a.ordinal == ordinal) {
        return;
    }
    let Some(device) = p.gpus.get(&ordinal).and_then(|gpu| gpu.device.clone()) else { return };
    let Some(tools) = state.gpus.remove(&ordinal) else { return };
    tools.release(device.as_ref(), &mut p);
}

/// The counters, as `--stats` prints them (stats.rs).
pub fn counters() -> stats::Migration {
    let (scanned, with_pointers, all_in_hbm) = hotness::launch_counts();
    let (up, down, failed, bytes) = rounds::counts();
    let (plan_nanos, pauses, pause_nanos, pause_chunks, cycles_followed, cycles_diverged) = crate::cycle::counters();
    stats::Migration {
        enabled: enabled(),
        up,
        down,
        failed,
        bytes,
        taken: TAKEN.load(Relaxed),
        skipped: SKIPPED.load(Relaxed),
        unsynced_pauses: UNSYNCED_PAUSES.load(Relaxed),
        nanos: NANOS.load(Relaxed),
        launches_scanned: scanned,
        launches_with_pointers: with_pointers,
        launches_all_in_hbm: all_in_hbm,
        segments: crate::cycle::enabled(),
        plan_nanos,
        pauses,
        pause_nanos,
        pause_chunks,
        cycles_followed,
        cycles_diverged,
        phases: remap::phases(),
    }
}
