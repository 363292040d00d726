//! What `bench swap` sets up on the machine, each undone when its guard is dropped (also on an
//! error or a panic), a module for each kind: swap areas taken off and put back, swap switched
//! on (`swap_areas`), zswap (`zswap`), loop devices (`loop_device`), zram (`zram`), files on
//! the local disk (`files`), the VRAM swap device (`vram_swap`), cgroups (`cgroups`); and
//! commands run with a time limit (`command`), a hung-task watch (`hung_tasks`), the machine's
//! counters and settings (`machine`). This module holds the signal flag that all of them heed
//! and the small helpers they share.
//!
//! Only for the GPU machine, as root: never run on a shared development machine (a swap
//! deadlock hangs it for everyone). The tests here touch none of it except the parsers.

mod cgroups;
mod command;
mod files;
mod hung_tasks;
mod loop_device;
mod machine;
mod page_cluster;
mod swap_areas;
mod vram_swap;
mod zram;
mod zswap;

pub use cgroups::{memory_event, remove_cgroup, Cgroups};
pub use command::{run_interruptible, which, Output};
pub use files::{free_bytes, in_memory_fs, TempFile};
pub use hung_tasks::{HungReport, HungWatch};
pub use loop_device::Loop;
pub use machine::{settings, vmstat};
pub use page_cluster::PageCluster;
pub use swap_areas::{active_swaps, OtherSwapsOff, SwapOn};
pub use vram_swap::VramSwap;
pub use zram::Zram;
pub use zswap::ZswapOff;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// Prefix of every file the benchmark makes in its folder (the shell's trap removes them).
pub const PREFIX: &str = "tiermem-swapbench-";

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// SIGINT, SIGTERM and SIGHUP (e.g. from `timeout`) set a flag instead of killing the process,
/// so that the measurement under way stops and every guard undoes what it set up.
pub fn catch_signals() {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(signal, on_signal as *const () as libc::sighandler_t) };
    }
}

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

fn write_file(path: impl AsRef<Path>, value: &str) -> Result<(), String> {
    let path = path.as_ref();
    std::fs::write(path, value).map_err(|e| format!("write {value:?} to {}: {e}", path.display()))
}

fn read_trim(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// Leaves an empty file `PREFIX<name>` in `dir` that says what a guard has changed (removed by
/// the guard once undone; the shell's trap finds those left by a run that died); its path.
fn leave_marker(dir: &Path, name: &str) -> PathBuf {
    let marker = dir.join(format!("{PREFIX}{name}"));
    let _ = std::fs::write(&marker, b"");
    marker
}

/// Reports an undoing step that failed (a guard's drop has no one to return it to).
fn warn_if_failed<T>(result: Result<T, String>) {
    if let Err(e) = result {
        eprintln!("bench swap: {e}");
    }
}
