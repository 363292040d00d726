//! The server process (`tiermem swap serve`, started detached by `tiermem swap on`).
//!
//! In order: lock all memory (`mlockall`), try `PR_SET_IO_FLUSHER`, leave memory-limited
//! cgroups, take the run directory's lock, open the store, mount the FUSE files, attach a
//! loop device with direct I/O to each, `mkswap` and `swapon` them at one priority, answer on
//! the control socket, and tell the starter it is ready (or why not, after undoing what it
//! did). It then serves until `stop` or SIGTERM/SIGINT: `swapoff` (the kernel reads every
//! page back first), detach the loop devices, unmount, exit. A `swapoff` that fails (not
//! enough RAM to take the pages back) leaves everything on and the server serving.
//!
//! ```text
//!  mod.rs      ServeConfig, serve(): start, tell the starter, serve
//!  process.rs  mlockall, PR_SET_IO_FLUSHER, OOM score, cgroups; the stop signals
//!  start.rs    run directory, store, state file, mount, loop devices, swapon; readiness
//!  server.rs   the control socket's requests, status, stop
//!  stores.rs   StoreControl and the stores: the engine's VramStore, MemBlocks for tests
//! ```

mod process;
mod server;
mod start;
mod stores;

pub use stores::{limits_for, open_store, OpenedStore, StoreControl};

use crate::control::RunDir;
use serde_json::json;
use std::fs::File;
use std::io::Write;
use std::os::fd::FromRawFd;
use std::path::PathBuf;
use std::time::SystemTime;

/// Which store serves the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// The tiermem engine: HBM, spilling to the file tier.
    Engine,
    /// Host memory ([`MemBlocks`](crate::MemBlocks)): for tests of the server and the CLI, never for swap.
    Memory,
}

/// Everything the server is told.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub size: u64,
    pub gpu: usize,
    pub priority: i32,
    pub spill: PathBuf,
    pub spill_size: u64,
    pub devices: usize,
    pub soft_limit: Option<u64>,
    pub hard_limit: Option<u64>,
    /// `swapon` the devices (`--no-enable`: serve the block devices only).
    pub enable: bool,
    /// Attach loop devices (off: serve the FUSE files only; for tests).
    pub attach_loops: bool,
    pub threads: usize,
    pub store: StoreKind,
    pub run_dir: RunDir,
    /// A descriptor to write one JSON line to when ready or failed, then close.
    pub notify_fd: Option<i32>,
}

fn log(message: &str) {
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    eprintln!("[{}.{:03}] tiermem swap serve: {message}", now.as_secs(), now.subsec_millis());
}

/// Runs the server: returns when it has stopped, or with why it could not start.
pub fn serve(config: ServeConfig) -> Result<(), String> {
    // Threads' stacks are locked whole (MCL_FUTURE): keep them small. Read once, at the first
    // thread; none has started yet.
    if std::env::var_os("RUST_MIN_STACK").is_none() {
        std::env::set_var("RUST_MIN_STACK", (1 << 20).to_string());
    }
    // SAFETY: the descriptor was opened by our starter for us alone (or is not given).
    let mut notify = config.notify_fd.filter(|fd| *fd > 2).map(|fd| unsafe { File::from_raw_fd(fd) });
    process::block_stop_signals();
    let started = start::start(&config).and_then(|server| match server.listen() {
        Ok(listener) => Ok((server, listener)),
        Err(error) => match server.stop(&mut |line| log(line)) {
            Ok(()) => Err(error),
            Err(undo) => Err(format!("{error}; undoing the set-up failed too: {undo} (see `tiermem swap off`)")),
        },
    });
    match started {
        Err(error) => {
            log(&format!("failed: {error}"));
            if let Some(file) = notify.as_mut() {
                let _ = writeln!(file, "{}", json!({"ok": false, "error": error}));
            }
            Err(error)
        }
        Ok((server, listener)) => {
            server.save(|s| s.phase = "ready".into());
            let ready = server.ready_message();
            log(&format!("ready: {ready}"));
            if let Some(mut file) = notify.take() {
                let _ = writeln!(file, "{ready}");
            }
            server.run(listener)
        }
    }
}
