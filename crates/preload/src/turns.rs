//! Waiting for the node daemon's turn: with `hbm_sharing = "working-sets"`, a program under
//! `tiermem run` that is not admitted with its whole working set is told to wait (its budget's
//! `wait`), and launches nothing until a budget without it comes.
//!
//! Why it waits instead of running on a little memory, as an engine's tenant does: a program
//! kept to a small budget reads the rest of its data in place over PCIe, in long kernels, and
//! while another process's kernels do that the driver charges the admitted program ~20× more
//! for each move's remapping (the daemon's turns.rs, "Holding the waiting"). So both would
//! crawl; waiting, the admitted one runs at its speed alone and the waiting one loses only the
//! time of the others' turns.
//!
//! The hold is at kernel launches and graph replays (launch.rs): the thread that launches
//! blocks before the launch until the wait ends, and the first launch after it (waited or not:
//! a program may launch nothing while it is held) takes a pause (migrate.rs) before it runs.
//! While it waited its chunks went to the host (its budget cut to its keep); its turn's budget
//! is used from a quiesce point on, and released mid-step without one, the rest of the step's
//! kernels would read them all in place: on the H200 such a step took 10–24 s against 0.23
//! (forty-second session). Copies, memsets, allocations and synchronizations go on (a waiting
//! program can still stage its next batch). The hold is the
//! process's: a program with tenants on several GPUs waits while any of them is told to.
//! Work already in flight finishes; the pause that then meets the smaller budget (lease.rs)
//! finds no new work. A link that loses its daemon ends the wait (crate `tiermem-tenant`), so
//! a program never stays held by a daemon that is gone. `TIERMEM_WAIT_FOR_TURNS=off` registers
//! the program as one that cannot wait: it then runs on what it keeps, as an engine's tenant.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Condvar, Mutex};
use std::time::Instant;

use crate::gpu_flags::GpuFlags;

/// GPUs (ordinals below 64) whose tenant is told to wait.
static WAITING: GpuFlags = GpuFlags::new();

/// Guards the wake-up: launches blocked on [`WOKEN`] are woken when a wait ends.
static LOCK: Mutex<()> = Mutex::new(());
static WOKEN: Condvar = Condvar::new();

/// A wait ended and no launch has begun the turn yet ([`wait_for_turn`]).
static BEGUN: AtomicBool = AtomicBool::new(false);

/// Waits so far (launches that blocked) and the nanoseconds they blocked, all threads together.
static WAITS: AtomicU64 = AtomicU64::new(0);
static WAITED_NANOS: AtomicU64 = AtomicU64::new(0);

/// Whether the program registers as one that can wait (`TIERMEM_WAIT_FOR_TURNS`, on by default).
pub fn enabled() -> bool {
    crate::boundary::switch("TIERMEM_WAIT_FOR_TURNS", true)
}

/// GPU `ordinal`'s tenant is told to wait (`true`) or no longer.
pub fn set(ordinal: usize, wait: bool) {
    let _guard = LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if WAITING.set(ordinal, wait) && !wait {
        BEGUN.store(true, SeqCst);
    }
    crate::trace::event("turn", || format!("\"gpu\": {ordinal}, \"wait\": {wait}"));
    WOKEN.notify_all();
}

/// Blocks the launch `name` while the program is told to wait (module documentation); whether
/// this launch is the first since a wait ended, whether it waited or the program launched
/// nothing meanwhile (it then takes the turn's pause). Two atomic reads when not waiting.
pub fn wait_for_turn(name: &str) -> bool {
    if !WAITING.any() {
        return BEGUN.load(SeqCst) && BEGUN.swap(false, SeqCst);
    }
    let started = Instant::now();
    let mut guard = LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    while WAITING.any() {
        guard = WOKEN.wait(guard).unwrap_or_else(|poisoned| poisoned.into_inner());
    }
    drop(guard);
    let waited = started.elapsed().as_nanos() as u64;
    WAITS.fetch_add(1, SeqCst);
    WAITED_NANOS.fetch_add(waited, SeqCst);
    crate::trace::event("turn_waited", || format!("\"call\": \"{name}\", \"ms\": {:.1}", waited as f64 / 1e6));
    // Of the launches that waited, one begins the turn.
    BEGUN.swap(false, SeqCst)
}

/// Launches that waited for a turn, and how long they waited in all (seconds).
pub fn waited() -> (u64, f64) {
    (WAITS.load(SeqCst), WAITED_NANOS.load(SeqCst) as f64 / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_launch_waits_until_the_wait_ends_and_not_otherwise() {
        assert!(!wait_for_turn("cuLaunchKernel"), "not told to wait: passes at once");
        set(3, true);
        let passed = Arc::new(AtomicBool::new(false));
        let launcher = {
            let passed = Arc::clone(&passed);
            std::thread::spawn(move || {
                assert!(wait_for_turn("cuLaunchKernel"));
                passed.store(true, SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        assert!(!passed.load(SeqCst), "a launch went through while its program was told to wait");
        set(3, false);
        launcher.join().unwrap();
        assert!(passed.load(SeqCst));
        let (waits, seconds) = waited();
        assert!(waits >= 1 && seconds >= 0.09, "{waits} waits, {seconds} s");
        // A wait that ends while the program launches nothing: its next launch begins the turn,
        // once.
        assert!(!wait_for_turn("cuLaunchKernel"));
        set(3, true);
        set(3, false);
        assert!(wait_for_turn("cuLaunchKernel"), "the first launch after the wait begins the turn");
        assert!(!wait_for_turn("cuLaunchKernel"), "and only the first");
    }
}
