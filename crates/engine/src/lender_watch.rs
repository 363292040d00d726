//! The thread that keeps borrowing from neighbour GPUs polite: every `period` it reads each
//! lender's free memory and gives back, at once, what the lender's reserve needs
//! (`Inner::watch_lenders`), so a program starting on a lender finds its memory even while
//! the borrowing program sits idle. It runs only when the engine has a peer tier, holds the
//! engine only while it looks (a weak reference otherwise), and stops when the engine drops.

use crate::engine::Inner;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

pub(crate) struct LenderWatch {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl LenderWatch {
    /// Starts watching for the engine behind `inner`, keeping `reserve` bytes free on lenders.
    pub fn start(inner: Weak<crate::sync::Mutex<Inner>>, reserve: usize, period: Duration) -> std::io::Result<Self> {
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
            let Some(inner) = inner.upgrade() else { return };
            let mut guard = inner.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = guard.watch_lenders(reserve) {
                eprintln!("tiermem: giving borrowed HBM back to a lender failed: {e}");
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
