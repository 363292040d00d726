//! The gate: at most as many engine copies in flight as the HBM budget can always hold.
//!
//! Every read or write of the engine acquires the chunk it touches for the length of the copy
//! (the engine copies through HBM, even for a chunk that lives in the file tier). If more
//! copies ran at once than the budget has chunks, the engine would refuse the surplus
//! (`OutOfMemory: ... acquired by others`) and the kernel would see EIO for a request that
//! only had to wait. The store splits its engine calls so that each touches one chunk, and
//! lets at most `min_budget` chunks' worth through at a time — the budget never goes below
//! that (limits.rs), so an admitted copy always finds room. Waiting here is rare: it takes
//! more request threads than `min_budget` has chunks (16 by default).
//!
//! A mutex and a condition variable; allocates nothing.

use std::sync::{Condvar, Mutex, MutexGuard};

/// A counting semaphore whose size can change. Thread safety: `Sync`; `enter` blocks.
pub(crate) struct Gate {
    state: Mutex<GateState>,
    left: Condvar,
}

struct GateState {
    inside: u64,
    capacity: u64,
}

/// One copy admitted; leaves the gate when dropped.
pub(crate) struct Pass<'a>(&'a Gate);

impl Gate {
    pub fn new(capacity: u64) -> Self {
        Self { state: Mutex::new(GateState { inside: 0, capacity: capacity.max(1) }), left: Condvar::new() }
    }

    fn lock(&self) -> MutexGuard<'_, GateState> {
        // The counts stay consistent across a panic elsewhere: take a poisoned lock as it is.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waits until fewer than `capacity` copies are in flight, and counts this one.
    pub fn enter(&self) -> Pass<'_> {
        let mut state = self.lock();
        while state.inside >= state.capacity {
            state = self.left.wait(state).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        state.inside += 1;
        Pass(self)
    }

    /// Changes the number of copies allowed at once (those inside stay).
    pub fn set_capacity(&self, capacity: u64) {
        self.lock().capacity = capacity.max(1);
        self.left.notify_all();
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        self.0.lock().inside -= 1;
        self.0.left.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn no_more_than_capacity_pass_at_once() {
        let gate = Gate::new(3);
        let (inside, most) = (AtomicU64::new(0), AtomicU64::new(0));
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..200 {
                        let _pass = gate.enter();
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::yield_now();
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                });
            }
        });
        let most = most.load(Ordering::SeqCst);
        assert!((1..=3).contains(&most), "{most} copies were inside a gate of 3");
        assert_eq!(gate.lock().inside, 0);
    }
}
