//! Failpoints are process-global: the tests of one test binary that configure them take this
//! lock, so they run one at a time, each from no configured failpoint.

use std::sync::{Mutex, MutexGuard};

static LOCK: Mutex<()> = Mutex::new(());

/// Serialises the failpoint tests and starts from no configured failpoint.
pub fn scenario() -> (MutexGuard<'static, ()>, fail::FailScenario<'static>) {
    let guard = LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    (guard, fail::FailScenario::setup())
}
