//! What `bench swap` sets up on the machine, each undone when its guard is dropped (also on an
//! error or a panic): swap areas taken off and put back, zswap, loop devices, zram, swap files,
//! the VRAM swap device, cgroups; and commands run with a time limit, a hung-task watch.
//!
//! Only for the GPU machine, as root: never run on a shared development machine (a swap
//! deadlock hangs it for everyone). The tests here touch none of it except the parsers.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// What a finished command said.
#[derive(Debug)]
pub struct Output {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// The last lines of stderr (else stdout), for a failure's reason.
    pub fn tail(&self) -> String {
        let text = if self.stderr.trim().is_empty() { &self.stdout } else { &self.stderr };
        let lines: Vec<&str> = text.trim().lines().collect();
        lines[lines.len().saturating_sub(4)..].join(" | ")
    }
}

/// Runs `program` with `args`, killed after `limit`. Its output goes to
/// files, not pipes, so that a server it leaves running cannot hold us on a pipe.
pub fn run_for(program: &str, args: &[&str], limit: Duration) -> Result<Output, String> {
    run_command(Command::new(program).args(args), limit).map_err(|e| format!("{program} {}: {e}", args.join(" ")))
}

/// [`run_for`] of a prepared command. A signal to us does not stop it (undoing a setup must
/// finish); only `limit` does.
pub fn run_command(command: &mut Command, limit: Duration) -> Result<Output, String> {
    run_inner(command, limit, false)
}

/// [`run_command`] that a signal to us also stops (a measurement).
pub fn run_interruptible(command: &mut Command, limit: Duration) -> Result<Output, String> {
    run_inner(command, limit, true)
}

fn run_inner(command: &mut Command, limit: Duration, interruptible: bool) -> Result<Output, String> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let base = std::env::temp_dir().join(format!("{PREFIX}out-{}-{n}", std::process::id()));
    let (out_path, err_path) = (base.with_extension("stdout"), base.with_extension("stderr"));
    let open = |p: &Path| File::create(p).map_err(|e| format!("create {}: {e}", p.display()));
    let (out, err) = (open(&out_path)?, open(&err_path)?);
    let result = (|| {
        let mut child =
            command.stdin(Stdio::null()).stdout(out).stderr(err).spawn().map_err(|e| format!("cannot start: {e}"))?;
        let started = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Ok(status.success()),
                Ok(None) if started.elapsed() > limit || (interruptible && interrupted()) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let why = if started.elapsed() > limit { "timed out" } else { "interrupted" };
                    return Err(format!("{why} after {:.0} s", started.elapsed().as_secs_f64()));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => return Err(format!("wait: {e}")),
            }
        }
    })();
    let read = |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    let output = result.map(|ok| Output { ok, stdout: read(&out_path), stderr: read(&err_path) });
    let _ = std::fs::remove_file(&out_path);
    let _ = std::fs::remove_file(&err_path);
    output
}

/// Runs a command that must succeed: its stdout, or why not.
pub fn must(program: &str, args: &[&str], limit: Duration) -> Result<String, String> {
    let out = run_for(program, args, limit)?;
    if out.ok {
        Ok(out.stdout)
    } else {
        Err(format!("{program} {} failed: {}", args.join(" "), out.tail()))
    }
}

/// Whether `program` can be found on PATH (or is a path to a file).
pub fn which(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return Path::new(program).is_file().then(|| PathBuf::from(program));
    }
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(program)).find(|p| p.is_file())
}

fn write_file(path: impl AsRef<Path>, value: &str) -> Result<(), String> {
    let path = path.as_ref();
    std::fs::write(path, value).map_err(|e| format!("write {value:?} to {}: {e}", path.display()))
}

fn read_trim(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

// ---------------------------------------------------------------- swap areas

/// An active swap area, as /proc/swaps lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct SwapArea {
    pub path: String,
    pub kind: String,
    pub size_kib: u64,
    pub used_kib: u64,
    pub priority: i64,
}

/// Parses /proc/swaps (paths there escape a space as `\040`).
pub fn parse_swaps(text: &str) -> Vec<SwapArea> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [path, kind, size, used, priority] = f[..] else { return None };
            Some(SwapArea {
                path: path.replace("\\040", " "),
                kind: kind.to_string(),
                size_kib: size.parse().ok()?,
                used_kib: used.parse().ok()?,
                priority: priority.parse().ok()?,
            })
        })
        .collect()
}

pub fn active_swaps() -> Vec<SwapArea> {
    parse_swaps(&std::fs::read_to_string("/proc/swaps").unwrap_or_default())
}

/// The swap areas that were active when the benchmark began, taken off so that each
/// measurement has its swap alone; put back, with their priorities, on drop.
pub struct OtherSwapsOff {
    pub before: Vec<SwapArea>,
}

impl OtherSwapsOff {
    /// Takes every active swap area off. An area that cannot be taken off is an error (the
    /// guard then puts back those that were).
    pub fn take() -> Result<Self, String> {
        let guard = OtherSwapsOff { before: active_swaps() };
        for area in &guard.before {
            eprintln!("bench swap: swapoff {} (active before the benchmark; put back at the end)", area.path);
            must("swapoff", &[&area.path], Duration::from_secs(300))?;
        }
        Ok(guard)
    }
}

impl Drop for OtherSwapsOff {
    fn drop(&mut self) {
        let now = active_swaps();
        for area in &self.before {
            if !now.iter().any(|a| a.path == area.path) {
                let priority = area.priority.to_string();
                let args: Vec<&str> =
                    if area.priority >= 0 { vec!["-p", &priority, &area.path] } else { vec![&area.path] };
                if let Err(e) = must("swapon", &args, Duration::from_secs(60)) {
                    eprintln!("bench swap: could not put back swap area {}: {e}", area.path);
                }
            }
        }
    }
}

/// zswap (a compressed cache in RAM in front of every swap device) off for the benchmark, so
/// that the devices themselves are measured; back as it was on drop.
pub struct ZswapOff {
    marker: PathBuf,
}

const ZSWAP: &str = "/sys/module/zswap/parameters/enabled";

impl ZswapOff {
    /// `Ok(None)` where zswap is absent or already off.
    pub fn take(dir: &Path) -> Result<Option<Self>, String> {
        match read_trim(ZSWAP).as_deref() {
            Some("Y") | Some("1") => {
                let marker = dir.join(format!("{PREFIX}zswap-was-on"));
                let _ = std::fs::write(&marker, b"");
                write_file(ZSWAP, "N")?;
                eprintln!("bench swap: zswap off for the benchmark (back on at the end)");
                Ok(Some(ZswapOff { marker }))
            }
            _ => Ok(None),
        }
    }
}

impl Drop for ZswapOff {
    fn drop(&mut self) {
        if let Err(e) = write_file(ZSWAP, "Y") {
            eprintln!("bench swap: could not turn zswap back on: {e}");
        }
        let _ = std::fs::remove_file(&self.marker);
    }
}

/// A file that is removed on drop.
pub struct TempFile(pub PathBuf);

impl TempFile {
    /// A file of `size` bytes with its blocks allocated (no holes: swap files need that).
    pub fn allocated(path: PathBuf, size: u64) -> Result<Self, String> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::remove_file(&path);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| format!("create {}: {e}", path.display()))?;
        let guard = TempFile(path);
        // SAFETY: plain syscall on a descriptor we own.
        if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, size as libc::off_t) } != 0 {
            return Err(format!(
                "fallocate {} bytes for {}: {}",
                size,
                guard.0.display(),
                std::io::Error::last_os_error()
            ));
        }
        Ok(guard)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A swap area switched on by us (a file or a device), switched off on drop.
pub struct SwapOn(pub String);

impl SwapOn {
    pub fn enable(path: &str, priority: i32) -> Result<Self, String> {
        must("mkswap", &[path], Duration::from_secs(60))?;
        must("swapon", &["-p", &priority.to_string(), path], Duration::from_secs(60))?;
        Ok(SwapOn(path.to_string()))
    }
}

impl Drop for SwapOn {
    fn drop(&mut self) {
        if let Err(e) = must("swapoff", &[&self.0], Duration::from_secs(300)) {
            eprintln!("bench swap: {e}");
        }
    }
}

// ---------------------------------------------------------------- loop devices, zram

/// A loop device over a file, with direct I/O (so the file's pages are not cached in RAM as
/// well); detached on drop.
pub struct Loop {
    pub device: String,
    /// Whether the kernel really does direct I/O on it (/sys/block/loopN/loop/dio).
    pub dio: bool,
}

impl Loop {
    pub fn attach(file: &Path) -> Result<Self, String> {
        let file = file.to_str().ok_or("a loop device's file must have a UTF-8 path")?;
        let limit = Duration::from_secs(30);
        let out = must("losetup", &["--direct-io=on", "--sector-size", "4096", "--show", "-f", file], limit)
            .or_else(|_| must("losetup", &["--direct-io=on", "--show", "-f", file], limit))?;
        let device = out.trim().to_string();
        if !device.starts_with("/dev/loop") {
            return Err(format!("losetup printed {device:?}, not a loop device"));
        }
        let name = device.trim_start_matches("/dev/");
        let dio = read_trim(format!("/sys/block/{name}/loop/dio")).as_deref() == Some("1");
        Ok(Loop { device, dio })
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        if let Err(e) = must("losetup", &["-d", &self.device], Duration::from_secs(60)) {
            eprintln!("bench swap: {e}");
        }
    }
}

/// A zram device of our own, reset (and removed, and the module unloaded, where we added them)
/// on drop.
pub struct Zram {
    pub id: u32,
    pub device: String,
    pub algorithm: String,
    hot_added: bool,
    loaded_module: bool,
    marker: PathBuf,
}

impl Zram {
    pub fn create(size: u64, dir: &Path) -> Result<Self, String> {
        let control = Path::new("/sys/class/zram-control");
        let mut loaded_module = false;
        if !control.exists() && !Path::new("/sys/block/zram0").exists() {
            must("modprobe", &["zram", "num_devices=0"], Duration::from_secs(30))
                .or_else(|_| must("modprobe", &["zram"], Duration::from_secs(30)))?;
            loaded_module = true;
        }
        let (id, hot_added) = match read_trim(control.join("hot_add")).and_then(|s| s.parse::<u32>().ok()) {
            Some(id) => (id, true),
            // No hot_add: an existing device that is not in use.
            None => (0..16)
                .find(|i| read_trim(format!("/sys/block/zram{i}/disksize")).as_deref() == Some("0"))
                .map(|i| (i, false))
                .ok_or("no unused zram device and no /sys/class/zram-control/hot_add")?,
        };
        let marker = dir.join(format!("{PREFIX}zram-{id}"));
        let _ = std::fs::write(&marker, b"");
        let mut zram =
            Zram { id, device: format!("/dev/zram{id}"), algorithm: String::new(), hot_added, loaded_module, marker };
        let sys = format!("/sys/block/zram{id}");
        write_file(format!("{sys}/disksize"), &size.to_string())?;
        zram.algorithm = read_trim(format!("{sys}/comp_algorithm"))
            .and_then(|s| s.split_whitespace().find(|a| a.starts_with('[')).map(|a| a.trim_matches(['[', ']']).into()))
            .unwrap_or_default();
        let until = Instant::now() + Duration::from_secs(5);
        while !Path::new(&zram.device).exists() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(zram)
    }
}

impl Drop for Zram {
    fn drop(&mut self) {
        let sys = format!("/sys/block/zram{}", self.id);
        let mut result = write_file(format!("{sys}/reset"), "1");
        if result.is_ok() && self.hot_added {
            result = write_file("/sys/class/zram-control/hot_remove", &self.id.to_string());
        }
        if result.is_ok() && self.loaded_module {
            result = must("modprobe", &["-r", "zram"], Duration::from_secs(30)).map(drop);
        }
        match result {
            Ok(()) => {
                let _ = std::fs::remove_file(&self.marker);
            }
            Err(e) => eprintln!("bench swap: undoing zram{}: {e}", self.id),
        }
    }
}

// ---------------------------------------------------------------- the VRAM swap device

/// A VRAM-backed swap device served by `tiermem swap on` (a server of its own); `tiermem swap
/// off` on drop, and if that fails, swapoff and detach of its loop devices.
pub struct VramSwap {
    exe: PathBuf,
    pub devices: Vec<String>,
}

/// The loop devices `tiermem swap on` prints, one per line.
pub fn parse_devices(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with("/dev/")))
        .map(|w| w.trim_end_matches([',', ':', ';']).to_string())
        .collect()
}

impl VramSwap {
    /// `tiermem swap on --size SIZE --spill SPILL [--no-enable] EXTRA…`.
    pub fn on(exe: &Path, size: u64, spill: &Path, enable: bool, extra: &[String]) -> Result<Self, String> {
        let exe_str = exe.to_str().ok_or("the tiermem binary's path is not UTF-8")?;
        let size = size.to_string();
        let spill = spill.to_str().ok_or("the spill file's path is not UTF-8")?;
        let mut args = vec!["swap", "on", "--size", &size, "--spill", spill];
        if !enable {
            args.push("--no-enable");
        }
        args.extend(extra.iter().map(String::as_str));
        let mut guard = VramSwap { exe: exe.to_path_buf(), devices: Vec::new() };
        // From here on, drop runs `swap off`, also if `swap on` failed half-way.
        let stdout = must(exe_str, &args, Duration::from_secs(300))?;
        guard.devices = parse_devices(&stdout);
        if guard.devices.is_empty() {
            return Err(format!("tiermem swap on printed no /dev/ device: {stdout:?}"));
        }
        Ok(guard)
    }

    /// `tiermem swap status --json`, or why not.
    pub fn status(&self) -> serde_json::Value {
        let out =
            run_for(self.exe.to_str().unwrap_or("tiermem"), &["swap", "status", "--json"], Duration::from_secs(30));
        match out {
            Ok(o) if o.ok => serde_json::from_str(o.stdout.trim())
                .unwrap_or_else(|e| serde_json::json!({"error": format!("not JSON ({e}): {}", o.stdout)})),
            Ok(o) => serde_json::json!({"error": o.tail()}),
            Err(e) => serde_json::json!({"error": e}),
        }
    }

    /// Forces the store's HBM cap to `bytes` (`tiermem swap cap BYTES --json`, whose reply is
    /// `{"ok":true,"cap_bytes":N,"seconds":S,"moved_bytes":M,"hbm_bytes":H}`): (seconds the
    /// move took, bytes moved to the file tier).
    pub fn set_cap(&self, bytes: u64) -> Result<(f64, f64), String> {
        let exe = self.exe.to_str().unwrap_or("tiermem");
        let stdout = must(exe, &["swap", "cap", &bytes.to_string(), "--json"], Duration::from_secs(300))?;
        parse_cap_reply(&stdout)
    }
}

/// The reply of `tiermem swap cap --json`: (seconds, bytes moved).
pub fn parse_cap_reply(stdout: &str) -> Result<(f64, f64), String> {
    let value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<serde_json::Value>(l.trim()).ok())
        .ok_or_else(|| format!("tiermem swap cap printed no JSON: {stdout:?}"))?;
    if value["ok"] == serde_json::json!(false) {
        return Err(format!("tiermem swap cap: {value}"));
    }
    let moved = value["moved_bytes"].as_f64().or_else(|| value["bytes"].as_f64());
    match (value["seconds"].as_f64(), moved) {
        (Some(s), Some(b)) => Ok((s, b)),
        _ => Err(format!("tiermem swap cap: no seconds and moved_bytes in {value}")),
    }
}

impl Drop for VramSwap {
    fn drop(&mut self) {
        let exe = self.exe.to_str().unwrap_or("tiermem");
        match must(exe, &["swap", "off"], Duration::from_secs(300)) {
            Ok(_) => {}
            Err(e) => {
                eprintln!("bench swap: {e}; taking its devices off by hand");
                for device in &self.devices {
                    let active = active_swaps().iter().any(|a| &a.path == device);
                    if active {
                        let _ = must("swapoff", &[device], Duration::from_secs(300));
                    }
                    let _ = must("losetup", &["-d", device], Duration::from_secs(60));
                }
            }
        }
    }
}

// ---------------------------------------------------------------- cgroups

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// A cgroup v2 folder of the benchmark's own, with the memory controller for its children;
/// on drop every process left in them is killed and the folders removed.
pub struct Cgroups {
    pub path: PathBuf,
    children: Mutex<Vec<PathBuf>>,
}

impl Cgroups {
    pub fn create() -> Result<Self, String> {
        let root = Path::new(CGROUP_ROOT);
        let controllers = read_trim(root.join("cgroup.controllers"))
            .ok_or_else(|| format!("no cgroup v2 at {CGROUP_ROOT} (no cgroup.controllers)"))?;
        if !controllers.split_whitespace().any(|c| c == "memory") {
            return Err(format!("the memory controller is not available at {CGROUP_ROOT}"));
        }
        let enabled = |p: &Path| {
            read_trim(p.join("cgroup.subtree_control")).is_some_and(|s| s.split_whitespace().any(|c| c == "memory"))
        };
        if !enabled(root) {
            write_file(root.join("cgroup.subtree_control"), "+memory")
                .map_err(|e| format!("cannot enable the memory controller for {CGROUP_ROOT}'s children: {e}"))?;
        }
        let path = root.join(format!("{PREFIX}{}", std::process::id()));
        std::fs::create_dir(&path).map_err(|e| format!("mkdir {}: {e}", path.display()))?;
        let groups = Cgroups { path, children: Mutex::new(Vec::new()) };
        write_file(groups.path.join("cgroup.subtree_control"), "+memory")?;
        Ok(groups)
    }

    /// A child with `memory.max` = `max` and unlimited swap; its path.
    pub fn child(&self, name: &str, max: u64) -> Result<PathBuf, String> {
        let path = self.path.join(name);
        if path.exists() {
            remove_cgroup(&path)?;
        }
        std::fs::create_dir(&path).map_err(|e| format!("mkdir {}: {e}", path.display()))?;
        self.children.lock().expect("cgroup list").push(path.clone());
        write_file(path.join("memory.max"), &max.to_string())?;
        if path.join("memory.swap.max").exists() {
            write_file(path.join("memory.swap.max"), "max")?;
        }
        Ok(path)
    }
}

/// The count of `key` in a cgroup's `memory.events` (e.g. `oom_kill`).
pub fn memory_event(cgroup: &Path, key: &str) -> u64 {
    let text = std::fs::read_to_string(cgroup.join("memory.events")).unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Kills whatever is left in a cgroup and removes it.
pub fn remove_cgroup(path: &Path) -> Result<(), String> {
    let procs = || read_trim(path.join("cgroup.procs")).unwrap_or_default();
    if !procs().is_empty() {
        if write_file(path.join("cgroup.kill"), "1").is_err() {
            for pid in procs().lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
                // SAFETY: plain syscall; these are the benchmark's own job processes.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        let until = Instant::now() + Duration::from_secs(10);
        while !procs().is_empty() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        match std::fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if Instant::now() > until => return Err(format!("rmdir {}: {e}", path.display())),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        for child in self.children.lock().expect("cgroup list").drain(..).rev() {
            if let Err(e) = remove_cgroup(&child) {
                eprintln!("bench swap: {e}");
            }
        }
        if let Err(e) = remove_cgroup(&self.path) {
            eprintln!("bench swap: {e}");
        }
    }
}

// ---------------------------------------------------------------- machine facts

/// Counters of /proc/vmstat.
pub fn vmstat() -> HashMap<String, u64> {
    std::fs::read_to_string("/proc/vmstat")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter_map(|(k, v)| Some((k.to_string(), v.trim().parse().ok()?)))
        .collect()
}

/// The kernel settings that shape swapping, as they were during the run.
pub fn settings() -> serde_json::Value {
    let read = |p: &str| read_trim(p).map_or(serde_json::Value::Null, serde_json::Value::String);
    serde_json::json!({
        "kernel": read("/proc/sys/kernel/osrelease"),
        "vm.swappiness": read("/proc/sys/vm/swappiness"),
        "vm.page-cluster": read("/proc/sys/vm/page-cluster"),
        "vm.min_free_kbytes": read("/proc/sys/vm/min_free_kbytes"),
        "transparent_hugepage": read("/sys/kernel/mm/transparent_hugepage/enabled"),
        "zswap": read(ZSWAP),
        "io_uring_disabled": read("/proc/sys/kernel/io_uring_disabled"),
        "hung_task_timeout_secs": read("/proc/sys/kernel/hung_task_timeout_secs"),
        "mem_total_kib": read_trim("/proc/meminfo").and_then(|m| m.lines().next().map(|l| l.split_whitespace().nth(1).unwrap_or("").to_string())),
    })
}

/// The file system type of `dir` (statfs's magic number), and whether it lives in memory.
pub fn in_memory_fs(dir: &Path) -> Result<bool, String> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: statfs fills the struct we pass; the path is a valid C string.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statfs(c.as_ptr(), &mut s) } != 0 {
        return Err(format!("statfs {}: {}", dir.display(), std::io::Error::last_os_error()));
    }
    const TMPFS: i64 = 0x0102_1994;
    const RAMFS: i64 = 0x8584_58f6;
    Ok(matches!(s.f_type as i64, TMPFS | RAMFS))
}

/// Free bytes on the file system of `dir`.
pub fn free_bytes(dir: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else { return 0 };
    // SAFETY: statvfs fills the struct we pass; the path is a valid C string.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return 0;
    }
    s.f_bavail as u64 * s.f_frsize as u64
}

// ---------------------------------------------------------------- hung tasks

/// A task seen in uninterruptible sleep (state D) for a long stretch.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StuckTask {
    pub tid: u32,
    pub comm: String,
    pub seconds: f64,
    pub wchan: String,
    pub stack: Vec<String>,
}

/// What the watch saw: tasks in D for at least [`HUNG_AFTER`] (hung), the longest D stretch
/// of any task, and examples of the stuck ones with their kernel stacks.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct HungReport {
    pub hung_tasks: usize,
    pub tasks_in_d_over_1s: usize,
    pub longest_d_s: f64,
    pub samples: u64,
    pub stuck: Vec<StuckTask>,
}

/// A task in D this long counts as hung (the kernel's own watchdog waits 120 s; no swap-in
/// should take a second).
pub const HUNG_AFTER: f64 = 10.0;

/// The state letter and name of a task from its `stat` line ("tid (comm) S …"; comm may hold
/// spaces and parentheses).
pub fn parse_stat(line: &str) -> Option<(char, String)> {
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    let comm = line.get(open + 1..close)?.to_string();
    let state = line.get(close + 1..)?.trim_start().chars().next()?;
    Some((state, comm))
}

/// Samples every task's state every 200 ms on a thread of its own until finished.
pub struct HungWatch {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<HungReport>>,
}

impl HungWatch {
    pub fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || watch(&flag));
        HungWatch { stop, thread: Some(thread) }
    }

    pub fn finish(mut self) -> HungReport {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().and_then(|t| t.join().ok()).unwrap_or_default()
    }
}

impl Drop for HungWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn watch(stop: &AtomicBool) -> HungReport {
    let mut since: HashMap<u32, Instant> = HashMap::new();
    let mut report = HungReport::default();
    let mut over_1s: std::collections::HashSet<u32> = Default::default();
    let mut hung: HashMap<u32, StuckTask> = HashMap::new();
    while !stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        let mut in_d = std::collections::HashSet::new();
        for tid in all_tasks() {
            let Some((state, comm)) = read_trim(&tid.1).as_deref().and_then(parse_stat) else { continue };
            if state != 'D' {
                continue;
            }
            in_d.insert(tid.0);
            let first = *since.entry(tid.0).or_insert(now);
            let seconds = now.duration_since(first).as_secs_f64();
            report.longest_d_s = report.longest_d_s.max(seconds);
            if seconds >= 1.0 {
                over_1s.insert(tid.0);
            }
            if seconds >= HUNG_AFTER {
                let dir = tid.1.parent().map(Path::to_path_buf).unwrap_or_default();
                let entry = hung.entry(tid.0).or_insert_with(|| StuckTask {
                    tid: tid.0,
                    comm: comm.clone(),
                    seconds,
                    wchan: read_trim(dir.join("wchan")).unwrap_or_default(),
                    stack: read_trim(dir.join("stack")).unwrap_or_default().lines().map(str::to_string).collect(),
                });
                entry.seconds = seconds;
            }
        }
        since.retain(|tid, _| in_d.contains(tid));
        report.samples += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    report.tasks_in_d_over_1s = over_1s.len();
    report.hung_tasks = hung.len();
    let mut stuck: Vec<StuckTask> = hung.into_values().collect();
    stuck.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    stuck.truncate(10);
    report.stuck = stuck;
    report
}

/// Every task (thread) of the machine: (tid, path of its stat file).
fn all_tasks() -> Vec<(u32, PathBuf)> {
    let mut tasks = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else { return tasks };
    for proc in procs.flatten() {
        if proc.file_name().to_str().and_then(|n| n.parse::<u32>().ok()).is_none() {
            continue;
        }
        let Ok(threads) = std::fs::read_dir(proc.path().join("task")) else { continue };
        for thread in threads.flatten() {
            if let Some(tid) = thread.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) {
                tasks.push((tid, thread.path().join("stat")));
            }
        }
    }
    tasks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_swaps_is_parsed_with_escaped_spaces() {
        let text = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n\
                    /dev/loop3                              partition\t16777212\t0\t\t100\n\
                    /scratch/my\\040swap                     file\t\t8388604\t\t1024\t\t-2\n";
        let areas = parse_swaps(text);
        assert_eq!(areas.len(), 2);
        assert_eq!(
            areas[0],
            SwapArea {
                path: "/dev/loop3".into(),
                kind: "partition".into(),
                size_kib: 16777212,
                used_kib: 0,
                priority: 100
            }
        );
        assert_eq!(areas[1].path, "/scratch/my swap");
        assert_eq!(areas[1].priority, -2);
        assert!(parse_swaps("Filename Type Size Used Priority\n").is_empty());
    }

    #[test]
    fn a_task_stat_line_gives_state_and_name() {
        assert_eq!(parse_stat("42 (kworker/u8:1) D 2 0 0"), Some(('D', "kworker/u8:1".into())));
        assert_eq!(parse_stat("7 (a (b) c) S 1 7"), Some(('S', "a (b) c".into())));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn swap_on_devices_and_cap_replies_are_read() {
        assert_eq!(parse_devices("/dev/loop3\n/dev/loop4\n"), vec!["/dev/loop3", "/dev/loop4"]);
        assert_eq!(parse_devices("serving on /dev/loop7, priority 100\n"), vec!["/dev/loop7"]);
        assert!(parse_devices("nothing\n").is_empty());
        let reply = r#"{"ok":true,"cap_bytes":0,"seconds":0.5,"moved_bytes":1000,"hbm_bytes":0}"#;
        assert_eq!(parse_cap_reply(&format!("moving…\n{reply}\n")), Ok((0.5, 1000.0)));
        assert!(parse_cap_reply(r#"{"ok":false,"error":"no file tier"}"#).is_err());
        assert!(parse_cap_reply("{\"ok\": true}").is_err());
    }

    #[test]
    fn commands_time_out_and_report_their_output() {
        let out = run_for("sh", &["-c", "echo out; echo err >&2; exit 3"], Duration::from_secs(10)).unwrap();
        assert!(!out.ok);
        assert_eq!(out.stdout.trim(), "out");
        assert_eq!(out.tail(), "err");
        let slow = run_for("sleep", &["5"], Duration::from_millis(100));
        assert!(slow.unwrap_err().contains("timed out"));
        assert!(run_for("/nonexistent/program", &[], Duration::from_secs(1)).is_err());
    }

    #[test]
    fn the_hung_task_watch_runs_and_stops() {
        let watch = HungWatch::start();
        std::thread::sleep(Duration::from_millis(300));
        let report = watch.finish();
        assert!(report.samples >= 1);
    }
}
