//! The gate between the program's GPU work and migration: every routed call that enqueues work
//! which may touch tiermem's memory (kernel and graph launches, copies, memsets) holds the gate
//! *shared* while it enqueues; a migration holds it *exclusively*, then waits for the context,
//! so that nothing enqueued before it is still running and nothing is enqueued while a chunk is
//! being copied and remapped.
//!
//! Shared holds are short (the time the driver takes to enqueue; a synchronous copy holds it
//! until the copy is done), and they are never nested: a wrapper entered on a thread already
//! inside tiermem passes straight through without the gate (boundary.rs), so a driver that
//! calls its own exported functions cannot deadlock against a waiting migration.
//!
//! Besides the lock, the gate knows two things that forbid migration outright:
//! * a stream capture in progress (`cuStreamBeginCapture`…`cuStreamEndCapture`): the context
//!   synchronization a migration needs is illegal while a capture in the global mode is under
//!   way (PyTorch's default), and would invalidate the program's graph;
//! * a green context the program created (`cuGreenCtxCreate`): a migration waits for the
//!   program's contexts (contexts.rs), not for green ones, so work in one could still touch a
//!   chunk being moved. Migration stops for good, said once.

use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering::SeqCst};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

static GATE: RwLock<()> = RwLock::new(());
static CAPTURES: AtomicIsize = AtomicIsize::new(0);
static GREEN_CONTEXT: AtomicBool = AtomicBool::new(false);

/// Held while the program's work is enqueued (see the module documentation).
pub fn shared() -> RwLockReadGuard<'static, ()> {
    // The gate guards no data: a panic while it was held leaves nothing inconsistent.
    GATE.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Held by a migration: no routed work is enqueued meanwhile.
pub fn exclusive() -> RwLockWriteGuard<'static, ()> {
    GATE.write().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A stream capture began (`+1`) or ended (`-1`).
pub fn capture(delta: isize) {
    CAPTURES.fetch_add(delta, SeqCst);
}

/// Whether a stream capture is under way anywhere in the process.
pub fn capturing() -> bool {
    CAPTURES.load(SeqCst) > 0
}

/// The program created a green context.
pub fn green_context() {
    GREEN_CONTEXT.store(true, SeqCst);
}

/// Why no migration may happen now, if one may not.
pub fn forbidden() -> Option<&'static str> {
    if GREEN_CONTEXT.load(SeqCst) {
        Some("the program created a green context")
    } else if CAPTURES.load(SeqCst) > 0 {
        Some("a stream capture is under way")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captures_forbid_migration_while_they_last() {
        assert_eq!(forbidden(), None);
        capture(1);
        assert!(forbidden().is_some());
        capture(-1);
        assert_eq!(forbidden(), None);
    }
}
