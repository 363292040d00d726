//! Acquires that wait for the budget to grow (`Engine::wait_for_budget`).
//!
//! Standalone, an acquire larger than the HBM cap fails at once (`WouldNeverFit`), and one
//! that finds every chunk acquired fails too (`OutOfMemory`): nothing will change unless the
//! program itself releases something. Under the node daemon the cap is a budget that moves:
//! a tenant that just arrived starts with little while others give memory back, and an idle
//! tenant that wakes holds only its largest acquire until the borrowers return the rest. Such
//! an acquire should wait for the budget, not fail. So an engine told to wait (the tenant link
//! does, docs/daemon.md) retries an acquire that failed for want of HBM each time its budget
//! changes or a chunk is released, until it goes through or the wait is over; then it returns
//! the last error. It waits only while the budget is below the engine's own cap, and for an
//! acquire no larger than that cap: at its full cap nothing the daemon does can help (a program
//! holding every chunk acquired itself would only wait to fail), and an acquire larger than the
//! cap would never fit any budget (it fails at once, the error naming the engine's own cap).
//! Waiters are counted, so a release with nobody waiting costs one atomic load.

use crate::sync::{AtomicUsize, Condvar, Mutex, Ordering};
use crate::{Error, Result};
use std::time::{Duration, Instant};

/// How long a retry waits for news before trying again anyway.
const POLL: Duration = Duration::from_millis(50);

#[derive(Default)]
pub(crate) struct BudgetWait {
    /// How long an acquire waits for its budget; zero: not at all.
    limit: Mutex<Duration>,
    /// Bumped on every budget change or release that a waiter may care about.
    news: Mutex<u64>,
    changed: Condvar,
    waiters: AtomicUsize,
}

impl BudgetWait {
    pub fn set_limit(&self, limit: Duration) {
        *self.limit.lock().unwrap_or_else(|p| p.into_inner()) = limit;
    }

    /// The budget changed or chunks were released: waiting acquires try again.
    pub fn tell(&self) {
        if self.waiters.load(Ordering::Acquire) > 0 {
            *self.news.lock().unwrap_or_else(|p| p.into_inner()) += 1;
            self.changed.notify_all();
        }
    }

    /// Runs `acquire` until it does not fail for want of HBM, or the wait is over, or a budget
    /// that grows could no longer help (`may_help`, asked of each failure).
    pub fn retrying<T>(&self, mut acquire: impl FnMut() -> Result<T>, may_help: impl Fn(&Error) -> bool) -> Result<T> {
        let limit = *self.limit.lock().unwrap_or_else(|p| p.into_inner());
        if limit.is_zero() {
            return acquire();
        }
        let until = Instant::now() + limit;
        self.waiters.fetch_add(1, Ordering::AcqRel);
        let outcome = loop {
            let seen = *self.news.lock().unwrap_or_else(|p| p.into_inner());
            match acquire() {
                Err(e @ (Error::WouldNeverFit { .. } | Error::OutOfMemory { .. })) => {
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() || !may_help(&e) {
                        break Err(e);
                    }
                    let news = self.news.lock().unwrap_or_else(|p| p.into_inner());
                    if *news == seen {
                        let _ = self.changed.wait_timeout(news, left.min(POLL));
                    }
                }
                other => break other,
            }
        };
        self.waiters.fetch_sub(1, Ordering::AcqRel);
        outcome
    }
}
