//! Tenants that can wait for their turn (programs under `tiermem run`) linked to an in-process
//! daemon sharing whole working sets in turns: the one not admitted is told to wait, told to
//! go on when the other leaves, and never stays held by a daemon that is gone; the one in a
//! turn that runs out is told that the other waits for it.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{engine, socket};
use tiermem::{AllocOptions, Engine};
use tiermem_tenant::{DaemonLink, Registration, Tenant, Usage};

const SETTLE: Duration = Duration::from_secs(20);

/// An engine's tenant that says it can wait, and records what it is told.
struct Waiter {
    engine: Arc<Engine>,
    told: Mutex<Vec<bool>>,
    others_wait: Mutex<Vec<bool>>,
}

impl Tenant for Waiter {
    fn registration(&self) -> Registration {
        Registration { waits: true, ..Tenant::registration(&*self.engine) }
    }
    /// As a program under `tiermem run` reports: no acquires of its own to keep room for.
    fn usage(&self) -> Usage {
        let (tiers, transfers) = Tenant::usage(&*self.engine);
        (tiers, tiermem_protocol::TransferCounters { largest_acquire_bytes: 0, ..transfers })
    }
    fn meet_budget(&self, tier: tiermem_protocol::Tier, bytes: u64) -> Result<(), String> {
        Tenant::meet_budget(&*self.engine, tier, bytes)
    }
    fn wait_for_turn(&self, wait: bool) {
        self.told.lock().unwrap().push(wait);
    }
    fn others_wait(&self, others_wait: bool) {
        self.others_wait.lock().unwrap().push(others_wait);
    }
}

/// A waiter whose engine holds `mib` MiB, acquired once (so it is working).
fn waiter(mib: usize) -> Arc<Waiter> {
    let engine = engine();
    let (buffer, _) = engine.alloc(mib << 20, AllocOptions::default()).unwrap();
    engine.write(buffer, 0, &vec![1u8; mib << 20]).unwrap();
    Arc::new(Waiter { engine, told: Mutex::new(Vec::new()), others_wait: Mutex::new(Vec::new()) })
}

/// A daemon sharing 48 MiB in turns of `turn_ms` (0: turns never run out).
fn start_daemon(path: &std::path::Path, turn_ms: u64) -> tiermem_daemon::Spawned {
    let text = format!(
        "hbm_sharing = \"working-sets\"\nturn_ms = {turn_ms}\nidle_after_ms = 0\n[[gpu]]\nindex = 0\nhbm = \"48MiB\""
    );
    tiermem_daemon::spawn(path, tiermem_daemon::Config::parse(&text, "test").unwrap()).unwrap()
}

#[test]
fn the_tenant_not_admitted_waits_until_the_other_leaves_or_the_daemon_goes() {
    let path = socket("turns");
    let daemon = start_daemon(&path, 0);
    let a = waiter(32);
    let link_a = DaemonLink::attach(&a, path.clone(), None).unwrap();
    link_a.wait_for(SETTLE, |s| s.budget.is_some());
    let b = waiter(32);
    let link_b = DaemonLink::attach(&b, path.clone(), None).unwrap();
    // 32 + 32 MiB do not fit 48: A, the first, has its turn (turns never run out here); B waits.
    let state = link_b.wait_for(SETTLE, |s| s.waiting_for_turn);
    assert!(state.waiting_for_turn, "B should be told to wait: {state:?}");
    assert_eq!(*b.told.lock().unwrap(), [true]);
    assert!(!link_a.state().waiting_for_turn && a.told.lock().unwrap().is_empty(), "A runs");

    // A leaves: B is admitted and told to go on.
    link_a.end();
    let state = link_b.wait_for(SETTLE, |s| !s.waiting_for_turn);
    assert!(!state.waiting_for_turn, "{state:?}");
    assert_eq!(*b.told.lock().unwrap(), [true, false]);

    // A comes back and waits in its turn; then the daemon goes away: A is told to go on.
    let link_a = DaemonLink::attach(&a, path.clone(), None).unwrap();
    let state = link_a.wait_for(SETTLE, |s| s.waiting_for_turn);
    assert!(state.waiting_for_turn, "A should wait for B now: {state:?}");
    drop(daemon);
    let state = link_a.wait_for(SETTLE, |s| !s.connected && !s.waiting_for_turn);
    assert!(!state.waiting_for_turn, "{state:?}");
    assert_eq!(*a.told.lock().unwrap(), [true, false]);
    assert!(a.others_wait.lock().unwrap().is_empty(), "turns that never run out need no readying");
    drop(link_b);
}

#[test]
fn the_tenant_in_a_turn_that_runs_out_is_told_that_the_other_waits_until_the_daemon_goes() {
    let path = socket("others-wait");
    // Turns of 6 s: A is told once half its turn has run.
    let daemon = start_daemon(&path, 6_000);
    let a = waiter(32);
    let link_a = DaemonLink::attach(&a, path.clone(), None).unwrap();
    link_a.wait_for(SETTLE, |s| s.budget.is_some());
    assert!(!link_a.state().others_wait, "alone, nobody waits for A");
    let b = waiter(32);
    let link_b = DaemonLink::attach(&b, path.clone(), None).unwrap();
    let state = link_a.wait_for(SETTLE, |s| s.others_wait);
    assert!(state.others_wait, "A should be told that B waits: {state:?}");
    assert_eq!(*a.others_wait.lock().unwrap(), [true]);
    assert!(!link_b.state().others_wait && b.others_wait.lock().unwrap().is_empty(), "nobody waits for B");
    // The daemon goes: A makes ready for no turn's end.
    drop(daemon);
    let state = link_a.wait_for(SETTLE, |s| !s.connected && !s.others_wait);
    assert!(!state.others_wait, "{state:?}");
    assert_eq!(*a.others_wait.lock().unwrap(), [true, false]);
    drop(link_b);
}
