//! The engine's concurrency primitives, in one place so that they can be model-checked.
//!
//! Every `Mutex`, `Condvar`, atomic, channel and thread of the engine's own that other threads
//! share — the engine lock (engine.rs), fences and their event pool (fence.rs), the
//! background file reader (file_reads.rs), the background file writes (file_writes.rs) — is
//! taken from here rather than from `std`. Normally this module is `std` under other names
//! and changes nothing. In this crate's own unit tests built with the `shuttle` feature it is
//! [shuttle](https://docs.rs/shuttle): the same API, but every lock, wait, send and spawn is
//! a point where shuttle's scheduler picks which thread runs next, so a test run under
//! `shuttle::check_random` or `shuttle::check_pct` explores many interleavings, and reports
//! a deadlock (every thread blocked) as a failure with the schedule that led to it. The
//! model checks themselves are in model_checks.rs:
//!
//! ```text
//! cargo test -p tiermem --features shuttle --lib model_checks
//! ```
//!
//! Why `cfg(all(test, feature = "shuttle"))` and not the feature alone: shuttle's primitives
//! panic when used outside a `shuttle::check_*` run, and `cargo test --workspace
//! --all-features` turns the feature on for the integration tests and the Python extension,
//! which must keep real threads. So the feature only changes this crate's unit-test build;
//! a unit test there that makes an engine, a fence or a reader outside `shuttle::check_*`
//! must be `cfg(not(feature = "shuttle"))`. (tokio does the same with `loom` behind
//! `cfg(loom)`; shuttle fits better here because it models `std::sync::mpsc`.)
//!
//! [`Done`], a one-shot signal built from these, is here too: a background file write sets it
//! when its thread ends, and callers wait on it with the engine's lock released.
//!
//! What is *not* switched: the mechanism crate's threads (the file store's I/O thread pool,
//! the simulated device's lock). To shuttle, a call into them is one indivisible step that
//! may block the real thread for a while; nothing there waits on the engine's primitives.

#[cfg(not(all(test, feature = "shuttle")))]
pub(crate) use std::{
    sync::{atomic, mpsc, Arc, Condvar, Mutex, MutexGuard},
    thread,
};

#[cfg(all(test, feature = "shuttle"))]
pub(crate) use shuttle::{
    sync::{atomic, mpsc, Arc, Condvar, Mutex, MutexGuard},
    thread,
};

pub(crate) use atomic::{AtomicBool, AtomicUsize, Ordering};

/// A one-shot signal: set once (by a background file write's thread as it ends, however it
/// ends), waited on by any number of threads, none of which may hold the engine's lock.
#[derive(Default)]
pub(crate) struct Done {
    over: Mutex<bool>,
    changed: Condvar,
}

impl Done {
    /// Blocks until the signal is set.
    pub(crate) fn wait(&self) {
        let mut over = self.over.lock().unwrap_or_else(|p| p.into_inner());
        while !*over {
            over = self.changed.wait(over).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Whether the signal is set; never blocks for long.
    pub(crate) fn is_set(&self) -> bool {
        *self.over.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the signal and wakes every waiter.
    pub(crate) fn set(&self) {
        *self.over.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.changed.notify_all();
    }
}
