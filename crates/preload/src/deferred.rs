//! `cuMemFreeAsync` on tiermem's memory without blocking the program, and freed allocations
//! reused, as the driver's stream-ordered pool does.
//!
//! The driver's own `cuMemFreeAsync` returns at once and frees in stream order. Unmapping
//! memory that queued work may still touch is not safe (illegal-address errors), so tiermem
//! waited for the stream — which stops a program that allocates and frees asynchronously
//! every step (PyTorch's `cudaMallocAsync` backend, RAPIDS, TensorFlow's and XLA's
//! `cuda_malloc_async`) from running ahead of its GPU. Now an event is recorded on the stream
//! and the allocation is *kept*: still mapped, still in the books but marked as no longer the
//! program's (a second free is the driver's error, pointer queries get the driver's answers):
//!
//! * an allocation of the same size on the **same stream** takes it back at once — work on that
//!   stream runs after the work before the free, as with the driver's pool;
//! * once its event has completed (asked by an allocation of that size, and at quiesce points)
//!   any allocation of the same size takes it back, the oldest free first, so that a program
//!   repeating its steps gets its allocations back at the same addresses each time;
//! * at each quiesce point those done are unmapped, oldest first, beyond the *release
//!   threshold* the program set on the GPU's default pool — as the driver's pool gives memory
//!   back at synchronizations beyond it (0 by default; PyTorch's `cudaMallocAsync` backend sets
//!   it to the maximum);
//! * an allocation that does not fit the budget unmaps the oldest kept frees until it fits
//!   (waiting for pending ones only if those done are not enough): freed memory is the
//!   budget's again before anything spills to the host, and what is given back is what has
//!   waited longest for a reuse.
//!
//! A kept allocation stays in the books, so stage 3 moves it like any other: no launch names it,
//! so it is cold, and it goes down to the host first when HBM is short, and comes back up when
//! the launches that follow its reuse make it hot — as cached blocks of PyTorch's own caching
//! allocator do inside its segments. (Moves happen at quiesce points, when the GPU has finished
//! all work, the freeing stream's included.) Until unmapped it counts against the budget.
//!
//! A shared allocation (IPC) is never kept, and where no event can be made or recorded on the
//! stream (a stream of a context of the program's own) the free waits for the stream.
//!
//! Locking: the process lock (process.rs) before this module's list, never the other way.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

use tiermem_mechanism::{Device, EventHandle, StreamHandle};

use crate::driver::Stream;
use crate::process::{self, Freed, Process};

/// A freed allocation kept mapped: where it starts, its GPU and size, the stream it was freed
/// on, and the event recorded there at the free (`None` once it has completed).
struct Kept {
    va: u64,
    ordinal: usize,
    reserved: usize,
    stream: usize,
    event: Option<EventHandle>,
    device: Arc<dyn Device>,
}

/// Oldest first.
static KEPT: Mutex<Vec<Kept>> = Mutex::new(Vec::new());
/// Frees ordered on their streams, and allocations served by one kept mapped.
static ORDERED: AtomicU64 = AtomicU64::new(0);
static REUSED: AtomicU64 = AtomicU64::new(0);

/// The `--stats` line, if any free was ordered on its stream.
pub fn report() -> Option<String> {
    let (ordered, reused) = (ORDERED.load(Relaxed), REUSED.load(Relaxed));
    (ordered > 0).then(|| {
        format!("tiermem: stats: async frees: {ordered} ordered on their streams, {reused} taken back by a later allocation")
    })
}

fn kept() -> MutexGuard<'static, Vec<Kept>> {
    // Each change under the lock is one push, removal or field update: consistent after a panic.
    KEPT.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Keeps the allocation at `va` (GPU `ordinal`, `reserved` bytes) after the work queued on
/// `stream` so far, with `p` locked; `false` if no event could be made (the caller then frees
/// it the slow way).
pub fn defer(p: &Process, (va, ordinal, reserved): (u64, usize, usize), stream: Stream) -> bool {
    let Some(device) = p.gpus.get(&ordinal).and_then(|gpu| gpu.device.clone()) else { return false };
    let Ok(event) = device.create_event(false) else { return false };
    if device.record_event(event, StreamHandle(stream as u64)).is_err() {
        let _ = device.destroy_event(event);
        return false;
    }
    kept().push(Kept { va, ordinal, reserved, stream: stream as usize, event: Some(event), device });
    ORDERED.fetch_add(1, Relaxed);
    true
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
        // An event that cannot be waited for or queried is taken as done: its stream is gone,
        // or the context broken.
        let finished = match wait {
            true => entry.device.synchronize_event(event).map_or(true, |()| true),
            false => entry.device.event_done(event).unwrap_or(true),
        };
        if finished {
            let _ = entry.device.destroy_event(event);
            entry.event = None;
        }
    }
}

/// Unmaps the kept allocations that are done (all of them after [`reap`] with `wait`), oldest
/// first, keeping the newest up to `keep(ordinal)` bytes on each GPU.
pub fn trim(call: &str, keep: impl Fn(usize) -> usize) {
    let chosen = {
        let mut kept = kept();
        let (release, stay) = keep_newest(kept.drain(..).collect(), keep);
        *kept = stay;
        release
    };
    tear_down(call, chosen);
}

/// Splits `kept` (oldest first) into what to unmap and what stays: those pending stay, and of
/// those done, the newest up to `keep(ordinal)` bytes per GPU.
fn keep_newest(kept: Vec<Kept>, keep: impl Fn(usize) -> usize) -> (Vec<u64>, Vec<Kept>) {
    let mut room: BTreeMap<usize, usize> = BTreeMap::new();
    let (mut release, mut stay) = (Vec::new(), Vec::new());
    for entry in kept.into_iter().rev() {
        let left = room.entry(entry.ordinal).or_insert_with(|| keep(entry.ordinal));
        match entry.event {
            Some(_) => stay.push(entry),
            None if entry.reserved <= *left => {
                *left -= entry.reserved;
                stay.push(entry);
            }
            None => release.push(entry.va),
        }
    }
    stay.reverse();
    (release, stay)
}

/// Takes the kept allocations at `vas` out of the books and unmaps them.
fn tear_down(call: &str, vas: Vec<u64>) {
    if vas.is_empty() {
        return;
    }
    let freed: Vec<Freed> = {
        let mut p = process::lock();
        vas.into_iter().filter_map(|va| process::take_kept(&mut p, va)).collect()
    };
    for freed in freed {
        // A failure is said on stderr; the memory stays held.
        let _ = process::teardown(call, freed);
    }
}

/// Gives back kept frees of GPU `ordinal`, oldest first, until `need` more bytes of HBM fit its
/// budget, or none is left: those done with first, then, waiting for their events, the rest.
pub fn make_room(call: &str, ordinal: usize, need: usize) {
    reap(false);
    let freed = release_oldest(call, ordinal, need);
    if freed < need {
        reap(true);
        release_oldest(call, ordinal, need - freed);
    }
}

/// Unmaps the oldest kept frees of GPU `ordinal` that are done with and hold HBM (wherever
/// moves left them), until `need` bytes of HBM are given back; the bytes given back.
fn release_oldest(call: &str, ordinal: usize, need: usize) -> usize {
    let (vas, hbm) = {
        let p = process::lock();
        let mut kept = kept();
        let (mut vas, mut hbm, mut index) = (Vec::new(), 0, 0);
        while index < kept.len() && hbm < need {
            let entry = &kept[index];
            let in_hbm = process::hbm_bytes(&p, entry.va);
            if entry.event.is_none() && entry.ordinal == ordinal && in_hbm > 0 {
                hbm += in_hbm;
                vas.push(kept.remove(index).va);
            } else {
                index += 1;
            }
        }
        (vas, hbm)
    };
    tear_down(call, vas);
    hbm
}

/// A kept allocation of GPU `ordinal` with `reserved` bytes that an allocation on `stream`
/// (`None`: not stream-ordered) may take, the oldest first: one freed on the same stream, or
/// one whose event has completed — asked of the driver only for allocations of that size, so
/// that an allocation costs no query per kept free. Its start.
pub fn reuse(ordinal: usize, reserved: usize, stream: Option<Stream>) -> Option<u64> {
    let mut kept = kept();
    let at = kept.iter().position(|entry| {
        let same_stream = stream.is_some_and(|s| s as usize == entry.stream);
        (entry.ordinal, entry.reserved) == (ordinal, reserved)
            && (same_stream || entry.event.is_none_or(|event| entry.device.event_done(event).unwrap_or(false)))
    })?;
    let entry = kept.remove(at);
    REUSED.fetch_add(1, Relaxed);
    if let Some(event) = entry.event {
        let _ = entry.device.destroy_event(event);
    }
    Some(entry.va)
}
