//! `tiermem swap on`, and the hidden `tiermem swap serve` it starts: the server runs detached,
//! in its own session, logging to the run directory, and reports readiness (one JSON line) on
//! a pipe that `on` waits on.

use super::args::{OnArgs, ServeArgs};
use super::need_root;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::Duration;
use tiermem::format_size;
use tiermem_swap::control::RunDir;
use tiermem_swap::serve::ServeConfig;

const START_TIMEOUT: Duration = Duration::from_secs(300);

pub(super) fn on(args: OnArgs) -> Result<(), String> {
    let device = args.device;
    device.check()?;
    need_root("on")?;
    let run = RunDir::from_env();
    if run.server_running() {
        let pid = run.read_state().map(|s| format!(" (pid {})", s.pid)).unwrap_or_default();
        return Err(format!("swap is already on{pid}: `tiermem swap off` first"));
    }
    if let Some(state) = run.read_state() {
        return Err(format!(
            "a server that died (pid {}) left its devices behind: run `tiermem swap off` first",
            state.pid
        ));
    }
    run.create().map_err(|e| format!("{}: {e}", run.path().display()))?;
    let log = std::fs::File::create(run.log()).map_err(|e| format!("{}: {e}", run.log().display()))?;
    let log_err = log.try_clone().map_err(|e| e.to_string())?;

    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two descriptors of `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: pipe2 just opened both; each is owned once.
    let (ready_read, ready_write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let mut command = crate::own_program()?;
    command
        .args(["swap", "serve"])
        .args(device.to_args())
        .arg("--notify-fd=3")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .env("RUST_MIN_STACK", (1 << 20).to_string());
    let write_fd = ready_write.as_raw_fd();
    // SAFETY: between fork and exec only async-signal-safe calls: setsid, dup2, fcntl.
    unsafe {
        command.pre_exec(move || {
            libc::setsid();
            if write_fd == 3 {
                let flags = libc::fcntl(3, libc::F_GETFD);
                libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
            } else if libc::dup2(write_fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = command.spawn().map_err(|e| format!("starting the server: {e}"))?;
    drop(ready_write);
    let pid = child.id();
    eprintln!("tiermem swap: starting the server (pid {pid}, log {})", run.log().display());

    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(std::fs::File::from(ready_read)).read_line(&mut line);
        let _ = sender.send(line);
    });
    let line = match receiver.recv_timeout(START_TIMEOUT) {
        Ok(line) => line,
        Err(_) => {
            return Err(format!(
                "the server (pid {pid}) is not ready after {} s; see {}; `tiermem swap off` stops it",
                START_TIMEOUT.as_secs(),
                run.log().display()
            ))
        }
    };
    if line.trim().is_empty() {
        return Err(format!(
            "the server exited before it was ready (`tiermem swap off` cleans up whatever it left):\n{}",
            log_tail(&run, 20)
        ));
    }
    let reply: Value = serde_json::from_str(&line).map_err(|e| format!("the server said {line:?}: {e}"))?;
    if reply["ok"] != json!(true) {
        let error = reply["error"].as_str().unwrap_or("no reason given");
        return Err(format!("the server could not start: {error}"));
    }
    let loops: Vec<&str> = reply["loop_devices"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    let files: Vec<&str> = reply["files"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    let size = reply["size_bytes"].as_u64().unwrap_or(0) as usize;
    let what = if reply["swap_enabled"] == json!(true) {
        format!("swap at priority {}", device.priority)
    } else if loops.is_empty() {
        "FUSE files only (no loop devices)".to_string()
    } else {
        "block devices, not swap (--no-enable)".to_string()
    };
    eprintln!(
        "tiermem swap: on: {} on {} devices, {what}; store: {}",
        format_size(size),
        files.len(),
        reply["backend"].as_str().unwrap_or("?")
    );
    let mut out = std::io::stdout().lock();
    for name in if loops.is_empty() { &files } else { &loops } {
        let _ = writeln!(out, "{name}");
    }
    Ok(())
}

fn log_tail(run: &RunDir, lines: usize) -> String {
    let text = std::fs::read_to_string(run.log()).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

pub(super) fn serve(args: ServeArgs) -> Result<(), String> {
    let d = args.device;
    d.check()?;
    let store = d.store_kind()?;
    let config = ServeConfig {
        size: d.size,
        gpu: d.gpu,
        priority: d.priority,
        spill_size: d.spill_size.unwrap_or(d.size),
        spill: d.spill,
        devices: d.devices as usize,
        soft_limit: d.soft_limit,
        hard_limit: d.hard_limit,
        enable: !d.no_enable,
        attach_loops: !d.no_loop,
        threads: d.threads.map_or_else(|| tiermem_swap::FuseOptions::default().threads, usize::from),
        store,
        run_dir: RunDir::from_env(),
        notify_fd: args.notify_fd,
    };
    tiermem_swap::serve::serve(config)
}
