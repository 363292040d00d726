//! `cuMemFreeAsync` on tiermem's memory without blocking the program: the free is ordered on
//! its stream by an event, and the allocation is torn down once the event completes.
//!
//! The driver's own `cuMemFreeAsync` returns at once and frees in stream order. Unmapping
//! memory that queued work may still touch is not safe (illegal-address errors), so tiermem
//! waited for the stream — which stops a program that allocates and frees asynchronously
//! every step (PyTorch's `cudaMallocAsync` backend, RAPIDS) from running ahead of its GPU. Now
//! the allocation leaves the books at once (a second free is the driver's error, and no move
//! touches it), an event is recorded on the stream, and the allocation waits in a list; each
//! later allocation, free and quiesce point tears down those whose event has completed, and an
//! allocation that would not fit the budget waits for them first, so that memory freed in
//! stream order is the budget's again before anything spills to the host. Until torn down, a
//! freed allocation still counts against the budget, as the memory is still the GPU's.
//!
//! Where no event can be made or recorded (a stream of another context, a driver without
//! events) the free waits for the stream as before.

use std::sync::{Mutex, MutexGuard};

use tiermem_mechanism::{EventHandle, StreamHandle};

use crate::driver::Stream;
use crate::process::{self, Freed};

/// Freed allocations whose stream may still use them, each with the event that says it is done.
static PENDING: Mutex<Vec<(Freed, EventHandle)>> = Mutex::new(Vec::new());

fn pending() -> MutexGuard<'static, Vec<(Freed, EventHandle)>> {
    // Each change under the lock is one push or removal: consistent after a panic.
    PENDING.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Orders the teardown of `freed` after the work queued on `stream` so far; gives `freed` back
/// if no event could be made (the caller then waits for the stream).
pub fn defer(call: &str, freed: Freed, stream: Stream) -> Result<(), Freed> {
    let device = freed.device();
    let Ok(event) = device.create_event(false) else { return Err(freed) };
    if device.record_event(event, StreamHandle(stream as u64)).is_err() {
        let _ = device.destroy_event(event);
        return Err(freed);
    }
    pending().push((freed, event));
    reap(call, false);
    Ok(())
}

/// Whether frees are waiting for their streams.
pub fn any() -> bool {
    !pending().is_empty()
}

/// Tears down the freed allocations whose event has completed — all of them, waiting for their
/// events, if `wait`.
pub fn reap(call: &str, wait: bool) {
    let done: Vec<(Freed, EventHandle)> = {
        let mut pending = pending();
        let mut done = Vec::new();
        let mut at = 0;
        while at < pending.len() {
            let (freed, event) = &pending[at];
            let device = freed.device();
            // An event that cannot be waited for or queried is taken as done: its stream is
            // gone, or the context broken.
            let finished = match wait {
                true => device.synchronize_event(*event).map_or(true, |()| true),
                false => device.event_done(*event).unwrap_or(true),
            };
            if finished {
                done.push(pending.swap_remove(at));
            } else {
                at += 1;
            }
        }
        done
    };
    for (freed, event) in done {
        let _ = freed.device().destroy_event(event);
        // A failure is said on stderr; the memory stays held.
        let _ = process::teardown(call, freed);
    }
}
