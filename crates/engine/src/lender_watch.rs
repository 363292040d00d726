//! The thread that keeps borrowing from neighbour GPUs polite: every `period` it reads each
//! lender's free memory and gives back, at once, what the lender's reserve needs
//! (`Inner::watch_lenders`), so a program starting on a lender finds its memory even while
//! the borrowing program sits idle; then it copies a batch of chunks whose only copy is on a
//! lender to free host room (movement.rs, "Cleaning borrowed chunks"). It runs only when the engine has a peer tier, holds
//! the engine only while it looks (a weak reference otherwise), and stops when the engine drops
//! or, quietly, when the CUDA driver shuts down under it (a process exiting with its engine
//! still alive, as a Python interpreter does with a module-level pool).

use crate::engine::Inner;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the watch reads the lenders' free memory.
const LENDER_POLL: Duration = Duration::from_millis(100);

/// The most chunks cleaned per poll of the lender watch (64 MiB of 4 MiB chunks; movement.rs, "Cleaning
/// borrowed chunks").
pub const CLEAN_BATCH: usize = 16;

pub(crate) struct LenderWatch {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl LenderWatch {
    /// Calls `watch` every `period` until it returns `false` (the engine is gone) or the
    /// watch is dropped.
    pub fn start(watch: impl Fn() -> bool + Send + 'static, period: Duration) -> std::io::Result<Self> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new().name("tiermem-lenders".into()).spawn(move || loop {
            let (lock, wake) = &*flag;
            let stopped = lock.lock().unwrap_or_else(|p| p.into_inner());
            let (stopped, _) = wake.wait_timeout(stopped, period).unwrap_or_else(|p| p.into_inner());
            if *stopped {
                return;
            }
            drop(stopped);
            if !watch() {
                return;
            }
        })?;
        Ok(Self { stop, thread: Some(thread) })
    }
}

impl Drop for LenderWatch {
    fn drop(&mut self) {
        let (lock, wake) = &*self.stop;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Starts the watch of `inner`'s lenders: every `LENDER_POLL`, `watch_lenders(reserve)`, then
/// (if `clean`) one batch of `clean_borrowed`. Failures are reported on stderr and the next poll
/// tries again, except the driver's shutdown, which ends the watch.
pub(crate) fn watch_lenders(
    inner: &crate::sync::Arc<crate::sync::Mutex<Inner>>,
    reserve: usize,
    clean: bool,
) -> std::io::Result<LenderWatch> {
    let weak = crate::sync::Arc::downgrade(inner);
    let watch = move || {
        let Some(inner) = weak.upgrade() else { return false };
        let mut guard = inner.lock().unwrap_or_else(|p| p.into_inner());
        let gave_back = guard.watch_lenders(reserve).map(drop);
        let inner = &mut *guard;
        let cleaned = match clean {
            true => inner.tiers.clean_borrowed(&mut inner.state, CLEAN_BATCH).map(drop),
            false => Ok(()),
        };
        for (what, result) in
            [("giving borrowed HBM back to a lender", gave_back), ("copying borrowed chunks to the host tier", cleaned)]
        {
            match result {
                Err(e) if e.is_driver_shutdown() => return false,
                Err(e) => eprintln!("tiermem: {what} failed: {e}"),
                Ok(()) => {}
            }
        }
        true
    };
    LenderWatch::start(watch, LENDER_POLL)
}
