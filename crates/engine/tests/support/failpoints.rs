//! Failpoints are process-global: the tests of one test binary that configure them take this
//! lock, so they run one at a time, each from no configured failpoint.

use std::sync::{Mutex, MutexGuard};

static LOCK: Mutex<()> = Mutex::new(());

/// Serialises the failpoint tests and starts from no configured failpoint.
pub fn scenario() -> (MutexGuard<'static, ()>, fail::FailScenario<'static>) {
    let guard = LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    (guard, fail::FailScenario::setup())
}

/// Pauses the thread that first reaches `failpoint` (later ones pass) until the test lets it
/// go: the receiver gets that thread's name when it arrives, and a wait on the barrier lets
/// it go on.
pub fn pause_first(failpoint: &str) -> (std::sync::mpsc::Receiver<Option<String>>, std::sync::Arc<std::sync::Barrier>) {
    let (reached, at_failpoint) = std::sync::mpsc::channel();
    let go = std::sync::Arc::new(std::sync::Barrier::new(2));
    let first = std::sync::atomic::AtomicBool::new(true);
    let go_there = std::sync::Arc::clone(&go);
    fail::cfg_callback(failpoint, move || {
        if first.swap(false, std::sync::atomic::Ordering::SeqCst) {
            let _ = reached.send(std::thread::current().name().map(str::to_owned));
            go_there.wait();
        }
    })
    .unwrap();
    (at_failpoint, go)
}
