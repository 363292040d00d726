//! `tiermem swap off`: asks the server to stop (swapoff, loop devices, unmount) and waits for
//! it to exit, or cleans up after a server that died.

use super::args::OffArgs;
use super::need_root;
use std::time::{Duration, Instant};
use tiermem_swap::control::{self, CallError, Request, RunDir};

pub(super) fn off(args: OffArgs) -> Result<(), String> {
    need_root("off")?;
    let run = RunDir::from_env();
    let deadline = args.timeout.map(|s| Instant::now() + Duration::from_secs_f64(s.max(0.0)));
    let mut progress = |line: &str| eprintln!("tiermem swap: {line}");
    if run.server_running() {
        let pid = run.read_state().map(|s| s.pid);
        match control::call(&run.socket(), &Request::Stop, deadline, &mut progress) {
            Ok(_) | Err(CallError::Closed) => {} // Closed: it exited as it replied
            Err(CallError::Timeout) => {
                return Err(format!(
                    "the server is still stopping after {:.0} s (swapoff reads every page back into RAM first); \
                     it goes on: run `tiermem swap off` again to wait",
                    args.timeout.unwrap_or(0.0)
                ))
            }
            Err(CallError::Connect(e)) => {
                // No socket yet (still starting): SIGTERM stops it the same way once it can.
                if let Some(pid) = pid {
                    progress(&format!("{e}; sending SIGTERM to {pid}"));
                    // SAFETY: kill takes integers only.
                    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
                }
            }
            Err(e) => {
                // A server killed a moment ago holds its lock while its threads end, and its
                // socket resets the connection: once it is gone, clean up after it.
                let gone = Instant::now() + Duration::from_secs(5);
                while run.server_running() && Instant::now() < gone {
                    std::thread::sleep(Duration::from_millis(50));
                }
                if run.server_running() {
                    return Err(format!("the server would not stop: {e}"));
                }
                return clean_up_after_dead(&run, &mut progress);
            }
        }
        while run.server_running() {
            if deadline.is_some_and(|d| Instant::now() > d) {
                return Err("the server has not exited yet; run `tiermem swap off` again to wait".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if run.read_state().is_some() {
            return Err(format!(
                "the server exited but left its state behind ({}); run `tiermem swap off` again to clean up",
                run.state().display()
            ));
        }
        eprintln!("tiermem swap: off");
        return Ok(());
    }
    clean_up_after_dead(&run, &mut progress)
}

/// Undoes what a server that is no longer running left behind, if anything.
fn clean_up_after_dead(run: &RunDir, progress: &mut dyn FnMut(&str)) -> Result<(), String> {
    let leftovers = run.read_state().is_some()
        || tiermem_swap::system::mount_type(&run.mountpoint()).is_some()
        || !tiermem_swap::system::loops_backed_under(&run.mountpoint()).is_empty();
    if !leftovers {
        eprintln!("tiermem swap: already off");
        return Ok(());
    }
    let pid = run.read_state().map(|s| format!(" (pid {})", s.pid)).unwrap_or_default();
    progress(&format!("the server{pid} is gone: cleaning up what it left"));
    control::clean_up_after_dead_server(run, progress)?;
    eprintln!("tiermem swap: off");
    Ok(())
}
