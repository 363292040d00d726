//! The thread that keeps borrowing from neighbour GPUs polite: every `period` it reads each
//! lender's free memory and gives back, at once, what the lender's reserve needs
//! (`Inner::watch_lenders`), so a program starting on a lender finds its memory even while
//! the borrowing program sits idle; then it copies a batch of chunks whose only copy is on a
//! lender to free host room (movement.rs, "Cleaning borrowed chunks"). It runs only when the engine has a peer tier, holds
//! the engine only while it looks (a weak reference otherwise), and stops when the engine drops
//! or, quietly, when the CUDA driver shuts down under it (a process exiting with its engine
//! still alive, as a Python interpreter does with a module-level pool).

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

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
