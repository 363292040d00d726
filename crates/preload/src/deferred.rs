//! `cuMemFreeAsync` on tiermem's memory without blocking the program, and freed allocations
//! reused, as the driver's stream-ordered pool does.
//!
//! The driver's own `cuMemFreeAsync` returns at once and frees in stream order. Unmapping
//! memory that queued work may still touch is not safe (illegal-address errors), so tiermem
//! waited for the stream — which stops a program that allocates and frees asynchronously
//! every step (PyTorch's `cudaMallocAsync` backend, RAPIDS, TensorFlow's and XLA's
//! `cuda_malloc_async`) from running ahead of its GPU. Now
//! the allocation leaves the books at once (a second free is the driver's error, and no move
//! touches it), an event is recorded on the stream, and the allocation is kept, still mapped:
//!
//! * an allocation of the same size on the **same stream** takes it back at once — work on that
//!   stream runs after the work before the free, as with the driver's pool;
//! * once its event has completed (asked by an allocation of that size, and at quiesce points)
//!   any allocation of the same size takes it back;
//! * at each quiesce point those done are unmapped, oldest first, beyond the *release
//!   threshold* the program set on the GPU's default pool — as the driver's pool gives memory
//!   back at synchronizations beyond it (0 by default; PyTorch's `cudaMallocAsync` backend sets
//!   it to the maximum, so a training loop's tensors come back at the same addresses each step,
//!   and their shadows with them, which lets stage 3 follow its cycle);
//! * an allocation that does not fit the budget unmaps the oldest kept frees holding HBM until
//!   it fits (waiting for pending ones only if those done are not enough): freed memory is the
//!   budget's again before anything spills to the host, and what is given back is what has
//!   waited longest for a reuse. While the program repeats its cycles (stage 3 follows them to
//!   their end), only the *stale* ones (not freed in the last [`STALE_AFTER`] cycles that
//!   allocated) go, and what does not fit then lives on the host, where the plan reaches it: giving back frees that the next step
//!   takes back sent that step's allocation to a new address, which gave back another free in
//!   turn, step after step, and the addresses the plan names never settled (BENCHMARKS.md,
//!   twenty-eighth session; `TIERMEM_KEPT_PRESSURE=oldest` for the old way).
//!
//! A kept free stays in the books, apart from the live allocations (allocations.rs), and in
//! the hotness index, so that the cycle's plan (cycle.rs) can place it: a program that
//! allocates its step's tensors from the pool frees most of them within the step, and at the
//! synchronization that plans the next step they are kept frees — which the next step's
//! allocations take back at the same addresses. The pointers recorded in the step name them, so
//! the plan brings them up before the segment that will reuse them and sends them down when
//! the step is done with them, as it does the live allocations — while the cycles are followed
//! to their end (a program whose shapes change has no step to repeat; `TIERMEM_PLAN_KEPT=off`:
//! kept frees always stay where they were placed). Stage 2's plan, which knows only heat, leaves them alone:
//! letting it move them as cold memory was measured on the GPU, and with PyTorch's
//! `cudaMallocAsync` backend under a budget it moved four times the bytes and ran a step
//! slower (BENCHMARKS.md, twentieth session). Planned by the cycle, with the addresses settled
//! and working sets weighed in bytes, a step at 0.7× its peak took 1.2 s against 2.2.
//!
//! Reuse takes the free at the address that the allocation in the same place of the cycle
//! before got, so that a program repeating its steps gets each tensor back where it was
//! (reuse_order.rs), else the oldest matching free.
//!
//! Until unmapped, a freed allocation counts against the budget: the memory is still the GPU's.
//! Where no event can be made or recorded on the stream (a stream of a context of the program's
//! own), the free waits for the stream as before.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

use tiermem_mechanism::{Device, EventHandle, StreamHandle};

use crate::driver::Stream;
use crate::give_back;
use crate::process::{self, Freed};
use crate::reuse_order::{CycleKey, Orders, Shape};

/// A freed allocation kept mapped in the books (process.rs): its start, its GPU and bytes
/// reserved (`None`: shared, never reused), the stream it was freed on, and the event recorded
/// there at the free (`None` once it has completed).
struct Kept {
    /// The allocating cycle it was freed in ([`GENERATION`]).
    freed_in: u64,
    va: u64,
    shape: (usize, usize),
    reusable: bool,
    device: Arc<dyn Device>,
    stream: usize,
    event: Option<EventHandle>,
}

static KEPT: Mutex<Vec<Kept>> = Mutex::new(Vec::new());
static ORDERS: Mutex<Option<Orders>> = Mutex::new(None);
/// Cycles that allocated, so far (reuse_order.rs): a kept free not freed in the last
/// [`STALE_AFTER`] of them is stale, taken back by no step.
static GENERATION: AtomicU64 = AtomicU64::new(0);
const STALE_AFTER: u64 = 2;
/// Kept frees given back for an allocation that did not fit.
static PRESSED: AtomicU64 = AtomicU64::new(0);
/// Frees ordered on their streams, and allocations served by one kept mapped.
static ORDERED: AtomicU64 = AtomicU64::new(0);
static REUSED: AtomicU64 = AtomicU64::new(0);

/// The `--stats` line, if any free was ordered on its stream.
pub fn report() -> Option<String> {
    let (ordered, reused, pressed) = (ORDERED.load(Relaxed), REUSED.load(Relaxed), PRESSED.load(Relaxed));
    (ordered > 0).then(|| {
        format!(
            "tiermem: stats: async frees: {ordered} ordered on their streams, {reused} taken back by a later allocation, \
             {pressed} given back for one that did not fit"
        )
    })
}

fn kept() -> MutexGuard<'static, Vec<Kept>> {
    // Each change under the lock is one push, removal or field update: consistent after a panic.
    KEPT.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Orders the teardown of `freed` after the work queued on `stream` so far; gives `freed` back
/// if no event could be made (the caller then waits for the stream).
pub fn defer(freed: Freed, stream: Stream) -> Result<(), Freed> {
    let device = freed.device().clone();
    let Ok(event) = device.create_event(false) else { return Err(freed) };
    if device.record_event(event, StreamHandle(stream as u64)).is_err() {
        let _ = device.destroy_event(event);
        return Err(freed);
    }
    let (va, shape, reusable) = (freed.va(), freed.shape(), freed.reusable_as().is_some());
    process::keep(freed);
    let freed_in = GENERATION.load(Relaxed);
    kept().push(Kept { freed_in, va, shape, reusable, device, stream: stream as usize, event: Some(event) });
    ORDERED.fetch_add(1, Relaxed);
    Ok(())
}

/// Whether freed allocations are kept.
pub fn any() -> bool {
    !kept().is_empty()
}

/// Marks done the kept allocations whose event has completed — all of them, waiting for their
/// events, if `wait`.
pub fn reap(wait: bool) {
    for entry in kept().iter_mut() {
        let Some(event) = entry.event else { continue };
        let device = entry.device.as_ref();
        // An event that cannot be waited for or queried is taken as done: its stream is gone,
        // or the context broken.
        let finished = match wait {
            true => device.synchronize_event(event).map_or(true, |()| true),
            false => device.event_done(event).unwrap_or(true),
        };
        if finished {
            let _ = device.destroy_event(event);
            entry.event = None;
        }
    }
}

/// Unmaps the kept allocations that are done (all of them after [`reap`] with `wait`), oldest
/// first, keeping the newest up to `keep(ordinal)` bytes on each GPU (give_back.rs).
pub fn trim(call: &str, keep: impl Fn(usize) -> usize) {
    let hbm = process::kept_hbm();
    let done = take(|list| {
        let release = give_back::beyond_threshold(&summary(list, &hbm), keep);
        (0..list.len()).filter(|&index| release[index]).collect()
    });
    tear_down(call, done);
}

/// Tears down the kept allocations at `starts`; the bytes of HBM given back.
fn tear_down(call: &str, starts: Vec<u64>) -> usize {
    let mut hbm = 0;
    for freed in starts.into_iter().filter_map(process::unkeep) {
        hbm += freed.hbm_bytes();
        // A failure is said on stderr; the memory stays held.
        let _ = process::teardown(call, freed);
    }
    hbm
}

/// Gives back kept frees of GPU `ordinal`, oldest first, until `need` more bytes of HBM fit its
/// budget, or none is left: those done with first, then, waiting for their events, the rest.
/// While the program repeats its cycles (more than [`STALE_AFTER`] that allocated, the last
/// one followed to its end), only the stale ones (unless `TIERMEM_KEPT_PRESSURE=oldest`): what
/// does not fit then lives on the host.
pub fn make_room(call: &str, ordinal: usize, need: usize) {
    reap(false);
    // Only while the program repeats its cycles: one whose shapes change would otherwise spill
    // its new allocations while HBM holds frees no step takes back (BENCHMARKS.md).
    let stale_only = stale_policy() && GENERATION.load(Relaxed) > STALE_AFTER && crate::cycle::followed_last();
    let freed = release_oldest(call, ordinal, need, stale_only);
    if freed < need && !stale_only {
        reap(true);
        release_oldest(call, ordinal, need - freed, false);
    }
}

/// Whether an allocation that does not fit gives back only stale kept frees
/// (`TIERMEM_KEPT_PRESSURE=stale`, the default, or `oldest`). Giving back the oldest, stale or
/// not, sends an allocation that a later step makes again to a new address, which gives back
/// another kept free in turn, step after step: the addresses the plan names never settle.
fn stale_policy() -> bool {
    static STALE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *STALE.get_or_init(|| match std::env::var("TIERMEM_KEPT_PRESSURE").as_deref() {
        Err(_) | Ok("stale" | "") => true,
        Ok("oldest") => false,
        Ok(other) => {
            crate::boundary::log(
                "TIERMEM_KEPT_PRESSURE",
                &format!("{other:?} is neither stale nor oldest"),
                "taken as stale",
            );
            true
        }
    })
}

/// Unmaps the oldest kept frees of GPU `ordinal` that are done with and hold HBM (and are
/// stale, if `stale_only`), until `need` bytes of HBM are free (give_back.rs); the bytes of
/// HBM given back.
fn release_oldest(call: &str, ordinal: usize, need: usize, stale_only: bool) -> usize {
    let hbm = process::kept_hbm();
    let chosen = take(|list| give_back::oldest_holding_hbm(&summary(list, &hbm), ordinal, need, stale_only));
    PRESSED.fetch_add(chosen.len() as u64, Relaxed);
    let count = chosen.len();
    let given = tear_down(call, chosen);
    if count > 0 {
        crate::trace::event("given_back", || format!("\"frees\": {count}, \"hbm\": {given}, \"need\": {need}"));
    }
    given
}

/// What give_back.rs's choices see of the kept frees, given the HBM each holds (by start; the
/// moves change it).
fn summary(list: &[Kept], hbm: &BTreeMap<u64, usize>) -> Vec<give_back::Free> {
    let generation = GENERATION.load(Relaxed);
    list.iter()
        .map(|entry| {
            let (gpu, bytes) = entry.shape;
            let hbm = hbm.get(&entry.va).copied().unwrap_or(0);
            let stale = entry.freed_in + STALE_AFTER < generation;
            give_back::Free { gpu, bytes, hbm, done: entry.event.is_none(), stale }
        })
        .collect()
}

/// Takes out of the list the kept frees at the indices `choose` returns (ascending); their
/// starts, oldest first.
fn take(choose: impl FnOnce(&[Kept]) -> Vec<usize>) -> Vec<u64> {
    let mut list = kept();
    let chosen = choose(&list);
    // From the last, so that the indices before stay valid; then oldest first again.
    let mut taken: Vec<u64> = chosen.iter().rev().map(|&index| list.remove(index).va).collect();
    taken.reverse();
    taken
}

/// The start of a kept allocation of GPU `ordinal` with `reserved` bytes that an allocation on
/// `stream` (`None`: not stream-ordered) may take (the caller holds the process state and puts
/// it back in the books): one freed on the same stream, or one whose event has completed —
/// asked of the driver only for allocations of that size, so that an allocation costs no query
/// per kept free.
pub fn reuse(ordinal: usize, reserved: usize, stream: Option<Stream>) -> Option<u64> {
    let wanted = orders(|orders| orders.wanted((ordinal, reserved)));
    let mut kept = kept();
    let may_take = |entry: &Kept| {
        let same_stream = stream.is_some_and(|s| s as usize == entry.stream);
        entry.reusable
            && entry.shape == (ordinal, reserved)
            && (same_stream || entry.event.is_none_or(|event| entry.device.event_done(event).unwrap_or(false)))
    };
    let at = wanted
        .and_then(|va| kept.iter().position(|entry| entry.va == va && may_take(entry)))
        .or_else(|| kept.iter().position(may_take))?;
    let entry = kept.remove(at);
    REUSED.fetch_add(1, Relaxed);
    if let Some(event) = entry.event {
        let _ = entry.device.destroy_event(event);
    }
    Some(entry.va)
}

fn orders<T>(f: impl FnOnce(&mut Orders) -> T) -> T {
    // Each change under the lock is a map update: consistent after a panic.
    let mut orders = ORDERS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    f(orders.get_or_insert_with(Orders::new))
}

/// An allocation of `shape` (GPU, bytes reserved) was served at `va`: its place in the cycle
/// (reuse_order.rs).
pub fn served(shape: Shape, va: u64) {
    orders(|orders| orders.served(shape, va));
}

/// The program synchronized (or, one that does not, paused): cycle `ended` is over and `next`
/// predicted (cycle.rs), the allocations' places start again (reuse_order.rs), and a cycle that
/// allocated makes the frees before it older.
pub fn cycle_ends(ended: CycleKey, next: CycleKey) {
    if orders(|orders| orders.cycle_ends(ended, next)) {
        GENERATION.fetch_add(1, Relaxed);
    }
}
