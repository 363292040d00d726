//! `tiermem swap on|off|status|limits|cap`: a swap device whose pages live in idle VRAM
//! (docs/swap.md). `on` starts the server (`tiermem swap serve`, hidden) detached and waits
//! until its devices are swap; the others talk to it on its control socket.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tiermem::format_size;
use tiermem_swap::control::{self, CallError, Request, RunDir, StatusReport};
use tiermem_swap::serve::{ServeConfig, StoreKind};

#[derive(clap::Subcommand)]
pub enum SwapCommand {
    /// Start a swap device in idle VRAM (spilling to a file): serves it detached, waits until
    /// it is swap, prints its loop devices (one a line, on stdout).
    On(OnArgs),
    /// Stop it: swapoff (every page is read back into RAM first; progress on stderr), detach
    /// the loop devices, unmount, end the server. Cleans up after a server that died too.
    Off(OffArgs),
    /// What the server says: devices, bytes present, in HBM and in the file tier, limits,
    /// give-backs, requests; and the devices' lines of /proc/swaps.
    Status(SwapStatusArgs),
    /// Change the limits, in free VRAM (soft: take no more while less is free; hard: give VRAM
    /// back, moving pages to the spill file, while less is free).
    Limits(LimitsArgs),
    /// Force the device's HBM down to SIZE (give-back, as when GPU work claims the memory) and
    /// say how long it took; `none` lifts the cap.
    Cap(CapArgs),
    /// The server itself (started by `swap on`).
    #[command(hide = true)]
    Serve(ServeArgs),
}

fn parse_bytes(text: &str) -> Result<u64, String> {
    tiermem::parse_size(text).map(|b| b as u64)
}

/// A size, or `none`.
fn parse_limit(text: &str) -> Result<Limit, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "none" | "off" | "max" => Ok(Limit(None)),
        _ => parse_bytes(text).map(|b| Limit(Some(b))),
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Limit(Option<u64>);

const DEFAULT_SPILL: &str = "/var/tmp/tiermem/swap-spill";

/// What `swap on` and the server it starts share.
#[derive(clap::Args, Clone, Debug)]
pub struct DeviceArgs {
    /// The device's size (e.g. 16GiB): at most the GPU's free memory plus the spill file.
    #[arg(long, value_parser = parse_bytes)]
    size: u64,
    /// The GPU whose memory holds the pages.
    #[arg(long, default_value_t = 0)]
    gpu: usize,
    /// Swap priority (0 to 32767): above any disk swap, so the kernel uses this first.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i32).range(0..=32767))]
    priority: i32,
    /// The file tier's file, where pages go when VRAM is short or wanted back (never on tmpfs).
    #[arg(long, default_value = DEFAULT_SPILL)]
    spill: PathBuf,
    /// The spill file's size (default: --size; 0: no file tier).
    #[arg(long, value_parser = parse_bytes)]
    spill_size: Option<u64>,
    /// Loop devices at one priority, each over its own slice: the kernel spreads swap I/O
    /// across them.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=16))]
    devices: u16,
    /// GAME's soft limit, in free VRAM: the device takes no more VRAM while less than this is
    /// free on the GPU, leaving it to GPU work (default 4GiB).
    #[arg(long, value_parser = parse_bytes)]
    soft_limit: Option<u64>,
    /// GAME's hard limit, in free VRAM: below this free, the device gives VRAM back, moving
    /// pages to the spill file (default 2GiB; at most the soft limit).
    #[arg(long, value_parser = parse_bytes)]
    hard_limit: Option<u64>,
    /// Serve the block devices without making them swap (for fio on the raw devices).
    #[arg(long)]
    no_enable: bool,
    /// FUSE server threads (default: the cores, 2 to 8).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    threads: Option<u16>,
    /// Tests only: serve the FUSE files without loop devices or swap.
    #[arg(long, hide = true)]
    no_loop: bool,
    /// Tests only: `memory` serves from host memory instead of the engine.
    #[arg(long, hide = true, default_value = "engine")]
    store: String,
}

impl DeviceArgs {
    fn check(&self) -> Result<(), String> {
        if self.size == 0 {
            return Err("--size must be more than 0".into());
        }
        tiermem_swap::fuse_server::split_devices(self.size, self.devices as usize)?;
        if let (Some(soft), Some(hard)) = (self.soft_limit, self.hard_limit) {
            if hard > soft {
                return Err(format!(
                    "--hard-limit {} is above --soft-limit {}: both are free VRAM, and the device gives back (hard) \
                     only below where it stops taking (soft)",
                    format_size(hard as usize),
                    format_size(soft as usize)
                ));
            }
        }
        tiermem_swap::serve::limits_for(self.soft_limit, self.hard_limit)?;
        self.store_kind()?;
        Ok(())
    }

    fn store_kind(&self) -> Result<StoreKind, String> {
        match self.store.as_str() {
            "engine" => Ok(StoreKind::Engine),
            "memory" => Ok(StoreKind::Memory),
            other => Err(format!("--store {other:?}: engine or memory")),
        }
    }

    /// The same arguments, for the server's command line.
    fn to_args(&self) -> Vec<String> {
        let mut args = vec![
            format!("--size={}", self.size),
            format!("--gpu={}", self.gpu),
            format!("--priority={}", self.priority),
            format!("--spill={}", self.spill.display()),
            format!("--devices={}", self.devices),
            format!("--store={}", self.store),
        ];
        let optional = [
            ("--spill-size", self.spill_size),
            ("--soft-limit", self.soft_limit),
            ("--hard-limit", self.hard_limit),
            ("--threads", self.threads.map(u64::from)),
        ];
        args.extend(optional.iter().filter_map(|(flag, v)| v.map(|v| format!("{flag}={v}"))));
        args.extend(self.no_enable.then(|| "--no-enable".to_string()));
        args.extend(self.no_loop.then(|| "--no-loop".to_string()));
        args
    }
}

#[derive(clap::Args)]
pub struct OnArgs {
    #[command(flatten)]
    device: DeviceArgs,
}

#[derive(clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    device: DeviceArgs,
    /// A descriptor to report readiness (one JSON line) on.
    #[arg(long)]
    notify_fd: Option<i32>,
}

#[derive(clap::Args)]
pub struct OffArgs {
    /// Give up waiting after this many seconds (the server goes on stopping; run `off` again to
    /// wait). Default: wait as long as swapoff takes.
    #[arg(long)]
    timeout: Option<f64>,
}

#[derive(clap::Args)]
pub struct SwapStatusArgs {
    /// Print JSON (for scripts): `{"running": false}`, or `"running": true` and the server's
    /// report.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct LimitsArgs {
    /// The soft limit, in free VRAM: take no more while less is free; unchanged when not given.
    #[arg(long, value_parser = parse_bytes)]
    soft: Option<u64>,
    /// The hard limit, in free VRAM: give back while less is free; unchanged when not given.
    #[arg(long, value_parser = parse_bytes)]
    hard: Option<u64>,
}

#[derive(clap::Args)]
pub struct CapArgs {
    /// The HBM the device may keep (e.g. 0, 2GiB), or none.
    #[arg(value_parser = parse_limit)]
    size: Limit,
    /// Give up waiting after this many seconds (the cap stays set).
    #[arg(long)]
    timeout: Option<f64>,
    /// Print the server's reply as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(command: SwapCommand) -> Result<(), String> {
    match command {
        SwapCommand::On(args) => on(args),
        SwapCommand::Off(args) => off(args),
        SwapCommand::Status(args) => status(args),
        SwapCommand::Limits(args) => limits(args),
        SwapCommand::Cap(args) => cap(args),
        SwapCommand::Serve(args) => serve(args),
    }
}

fn need_root(what: &str) -> Result<(), String> {
    // SAFETY: geteuid cannot fail and touches no memory of ours.
    if unsafe { libc::geteuid() } != 0 {
        return Err(format!("tiermem swap {what} needs root (mount, losetup, swapon and the control socket)"));
    }
    Ok(())
}

/// The server's socket, or why there is none to talk to.
fn running_server(run: &RunDir) -> Result<PathBuf, String> {
    if run.server_running() {
        return Ok(run.socket());
    }
    match run.read_state() {
        Some(state) => Err(format!(
            "the server (pid {}) died and left its devices behind: run `tiermem swap off` to clean up",
            state.pid
        )),
        None => Err("swap is off (`tiermem swap on --size SIZE` starts it)".into()),
    }
}

const START_TIMEOUT: Duration = Duration::from_secs(300);

fn on(args: OnArgs) -> Result<(), String> {
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
    let exe = std::env::current_exe().map_err(|e| format!("finding the tiermem program: {e}"))?;
    let mut command = Command::new(exe);
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

fn off(args: OffArgs) -> Result<(), String> {
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
            Err(e) => return Err(format!("the server would not stop: {e}")),
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
    let leftovers = run.read_state().is_some()
        || tiermem_swap::system::mount_type(&run.mountpoint()).is_some()
        || !tiermem_swap::system::loops_backed_under(&run.mountpoint()).is_empty();
    if !leftovers {
        eprintln!("tiermem swap: already off");
        return Ok(());
    }
    let pid = run.read_state().map(|s| format!(" (pid {})", s.pid)).unwrap_or_default();
    progress(&format!("the server{pid} is gone: cleaning up what it left"));
    control::clean_up_after_dead_server(&run, &mut progress)?;
    eprintln!("tiermem swap: off");
    Ok(())
}

fn status(args: SwapStatusArgs) -> Result<(), String> {
    let run = RunDir::from_env();
    if !run.server_running() {
        return match run.read_state() {
            Some(state) => {
                if args.json {
                    println!("{}", json!({"running": false, "stale": state}));
                }
                Err(format!(
                    "off, but the server (pid {}) died and left its devices behind: run `tiermem swap off` to clean up",
                    state.pid
                ))
            }
            None => {
                if args.json {
                    println!("{}", json!({"running": false}));
                } else {
                    println!("tiermem swap: off");
                }
                Ok(())
            }
        };
    }
    let report = control::status(&run.socket()).map_err(|e| format!("asking the server: {e}"))?;
    if args.json {
        let mut value = serde_json::to_value(&report).map_err(|e| e.to_string())?;
        value["running"] = json!(true);
        println!("{}", serde_json::to_string_pretty(&value).map_err(|e| e.to_string())?);
    } else {
        print!("{}", render(&report));
    }
    Ok(())
}

fn size(bytes: u64) -> String {
    format_size(bytes as usize)
}

fn optional(bytes: Option<u64>) -> String {
    bytes.map_or("none".into(), size)
}

fn render(r: &StatusReport) -> String {
    let mut out = format!(
        "tiermem swap: on, pid {}, up {:.0} s: {} on {} devices, {}\n",
        r.pid,
        r.uptime_s,
        size(r.size_bytes),
        r.devices.len(),
        if r.swap_enabled { format!("swap at priority {}", r.priority) } else { "not swap".into() }
    );
    let s = &r.store;
    out += &format!("store: {}\n", s.backend);
    out += &format!(
        "  present {}: HBM {}, host {}, file {}\n  limits in free VRAM: soft {}, hard {}; cap {}; gave back {} times, {}\n",
        size(s.present_bytes),
        size(s.hbm_bytes),
        size(s.host_bytes),
        size(s.file_bytes),
        optional(s.soft_limit_bytes),
        optional(s.hard_limit_bytes),
        optional(s.cap_bytes),
        s.give_backs,
        size(s.given_back_bytes)
    );
    let d = &s.detail;
    if let (Some(free), Some(total)) = (d["gpu"]["free"].as_u64(), d["gpu"]["total"].as_u64()) {
        out += &format!(
            "  GPU: {} free of {}; {}; HBM budget {}\n",
            size(free),
            size(total),
            d["pressure"].as_str().unwrap_or("?"),
            optional(d["hbm_budget"].as_u64())
        );
    }
    if let Some(last) = d["give_backs"]["last"].as_object() {
        let before = last.get("held_before").and_then(Value::as_u64).unwrap_or(0);
        let after = last.get("held_after").and_then(Value::as_u64).unwrap_or(0);
        let seconds = last.get("seconds").and_then(Value::as_f64).unwrap_or(0.0);
        out += &format!("  last give-back: {} in {seconds:.3} s\n", size(before.saturating_sub(after)));
    }
    if let Some(error) = d["last_monitor_error"].as_str() {
        out += &format!("  monitor: {} failed steps, last: {error}\n", d["monitor_errors"]);
    }
    out += "devices:\n";
    for d in &r.devices {
        let swap = d.swap.as_ref().map_or("not swap".into(), |a| {
            format!("swap: {} used of {}, priority {}", size(a.used_bytes), size(a.size_bytes), a.priority)
        });
        out += &format!(
            "  {:<12} {}  {}  {swap}\n",
            d.loop_device.as_deref().unwrap_or("-"),
            d.file.display(),
            size(d.size_bytes)
        );
    }
    if let Some(q) = &r.requests {
        let op = |name: &str, o: &tiermem_swap::fuse_server::OpReport| {
            let latency = match (o.mean_us, o.p50_us, o.p99_us) {
                (Some(mean), Some(p50), Some(p99)) => format!("mean {mean:.1} µs, p50 ≤{p50} µs, p99 ≤{p99} µs"),
                _ => String::new(),
            };
            format!("  {name:<9}{:>10}  {:>11}  {latency}\n", o.count, size(o.bytes))
        };
        out += "requests:\n";
        out += &op("reads", &q.reads);
        out += &op("writes", &q.writes);
        out += &op("discards", &q.discards);
        out += &format!("  errors {}, buffers allocated on the I/O path {}\n", q.errors, q.buffer_allocations);
    }
    let f = &r.fuse;
    out += &format!(
        "FUSE: ABI {}, async direct I/O {}, max write {}, {} threads, mounted at {}\n",
        f.abi,
        if f.async_dio { "on" } else { "off" },
        size(f.max_write as u64),
        r.process.fuse_threads,
        r.mountpoint.display()
    );
    let p = &r.process;
    out += &format!(
        "process: locked {}, PR_SET_IO_FLUSHER {}, oom_score_adj {}, cgroup {}\n",
        optional(p.locked_bytes),
        p.io_flusher,
        p.oom_score_adj,
        p.cgroup
    );
    let lines: Vec<String> = std::fs::read_to_string("/proc/swaps")
        .unwrap_or_default()
        .lines()
        .enumerate()
        .filter(|(i, line)| {
            *i == 0
                || r.devices
                    .iter()
                    .any(|d| d.loop_device.as_deref().is_some_and(|l| line.split_whitespace().next() == Some(l)))
        })
        .map(|(_, line)| format!("  {line}"))
        .collect();
    if lines.len() > 1 {
        out += &format!("/proc/swaps:\n{}\n", lines.join("\n"));
    }
    out
}

fn limits(args: LimitsArgs) -> Result<(), String> {
    let socket = running_server(&RunDir::from_env())?;
    if args.soft.is_none() && args.hard.is_none() {
        return Err("give --soft, --hard or both".into());
    }
    let request = Request::SetLimits { soft_bytes: args.soft, hard_bytes: args.hard };
    let reply = control::call(&socket, &request, Some(Instant::now() + Duration::from_secs(30)), &mut |_| {})?;
    println!(
        "tiermem swap: limits in free VRAM: soft {}, hard {}",
        optional(reply["soft_bytes"].as_u64()),
        optional(reply["hard_bytes"].as_u64())
    );
    Ok(())
}

fn cap(args: CapArgs) -> Result<(), String> {
    let socket = running_server(&RunDir::from_env())?;
    let request = Request::SetCap { bytes: args.size.0 };
    let wait = args.timeout.map(|s| Instant::now() + Duration::from_secs_f64(s.max(0.0)));
    let reply = control::call(&socket, &request, wait, &mut |_| {})?;
    if args.json {
        println!("{reply}");
        return Ok(());
    }
    let seconds = reply["seconds"].as_f64().unwrap_or(0.0);
    let moved = reply["moved_bytes"].as_u64().unwrap_or(0);
    let rate = if seconds > 0.0 { format!(", {:.2} GB/s", moved as f64 / seconds / 1e9) } else { String::new() };
    println!(
        "tiermem swap: HBM cap {} met in {seconds:.3} s (moved {}{rate}; HBM now {})",
        optional(args.size.0),
        size(moved),
        size(reply["hbm_bytes"].as_u64().unwrap_or(0))
    );
    Ok(())
}

fn serve(args: ServeArgs) -> Result<(), String> {
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
