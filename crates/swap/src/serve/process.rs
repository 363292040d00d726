//! Protecting the server process before it serves swap: its memory locked (`mlockall`),
//! `PR_SET_IO_FLUSHER`, out of the OOM killer's reach, out of memory-limited cgroups; and the
//! stop signals (SIGTERM, SIGINT), blocked in every thread and taken by one.

use super::log;
use crate::control::ProcessReport;
use crate::system;

/// Protects the process: locks its memory (unless `lock_after_open`, when [`lock_memory`] is
/// called once the store is open), sets it an I/O flusher, shields it from the OOM killer and
/// moves it out of memory-limited cgroups; says how each went.
pub(super) fn protect_process(lock_after_open: bool) -> Result<ProcessReport, String> {
    if !lock_after_open {
        lock_memory()?;
    }
    let io_flusher = match system::set_io_flusher() {
        Ok(()) => "ok".into(),
        Err(e) => format!("not set: {e}"),
    };
    let mut process = ProcessReport { io_flusher, ..Default::default() };
    log(&format!(
        "memory {}; PR_SET_IO_FLUSHER: {}",
        if lock_after_open { "to be locked once the store is open" } else { "locked" },
        process.io_flusher
    ));
    process.oom_score_adj = match system::protect_from_oom() {
        Ok(()) => "-1000".into(),
        Err(e) => format!("unchanged: {e}"),
    };
    process.cgroup = match system::leave_memory_limited_cgroup() {
        Ok(cgroup) => cgroup,
        Err(e) => {
            log(&format!("WARNING: cgroup: {e}"));
            format!("{} (WARNING: {e})", system::own_cgroup().unwrap_or_default())
        }
    };
    log(&format!("cgroup {}, oom_score_adj {}", process.cgroup, process.oom_score_adj));
    Ok(process)
}

/// `mlockall(MCL_CURRENT|MCL_FUTURE)`: nothing of this process may ever be swapped out.
pub(super) fn lock_memory() -> Result<(), String> {
    system::lock_memory().map_err(|e| format!("mlockall(MCL_CURRENT|MCL_FUTURE): {e} (run as root)"))
}

/// SIGTERM and SIGINT are taken by one thread (sigwait) and stop the server cleanly.
pub(super) fn block_stop_signals() {
    let set = stop_signals();
    // SAFETY: `set` is initialised; only this thread exists, so every later thread inherits
    // the mask.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

pub(super) fn wait_for_stop_signal() -> i32 {
    let set = stop_signals();
    let mut signal = 0;
    // SAFETY: `set` is initialised; sigwait writes the signal number into `signal`.
    unsafe { libc::sigwait(&set, &mut signal) };
    signal
}

/// SIGTERM and SIGINT: the signals that stop the server.
fn stop_signals() -> libc::sigset_t {
    // SAFETY: a sigset on the stack, initialised by sigemptyset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        set
    }
}
