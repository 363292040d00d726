//! The server's run directory, its state file, and its control socket.
//!
//! The run directory (`/run/tiermem/swap`, or `TIERMEM_RUN_DIR`) holds, mode 0700:
//! - `server.lock`: held (`flock`) by the server for its whole life: the test of "running";
//! - `state.json`: what the server has set up (mount, loop devices, swap areas, spill file),
//!   rewritten before and after each step, so that `tiermem swap off` can undo it after the
//!   server died (`kill -9`);
//! - `control.sock`: line-delimited JSON requests (one object a line) and replies;
//! - `serve.log`: the server's stdout and stderr;
//! - `mnt/`: the FUSE mount point.
//!
//! Requests: `{"cmd":"status"}`, `{"cmd":"set_limits","soft_bytes":N,"hard_bytes":N}` (either
//! may be left out), `{"cmd":"set_cap","bytes":N|null}`, `{"cmd":"stop"}`. Every reply is one line
//! with `"ok"`; failures carry `"error"`. `stop` first sends progress lines
//! (`{"ok":true,"progress":"…"}`) and ends with `{"ok":true,"stopped":true}`.

use crate::fuse_server::{IoReport, KernelTerms};
use crate::system::{self, SwapArea};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Overrides the run directory.
pub const RUN_DIR_ENV: &str = "TIERMEM_RUN_DIR";
const DEFAULT_RUN_DIR: &str = "/run/tiermem/swap";

/// The run directory and the files in it.
#[derive(Debug, Clone)]
pub struct RunDir(PathBuf);

impl RunDir {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        RunDir(path.into())
    }

    /// `TIERMEM_RUN_DIR`, else `/run/tiermem/swap`.
    pub fn from_env() -> Self {
        RunDir(std::env::var_os(RUN_DIR_ENV).map_or_else(|| PathBuf::from(DEFAULT_RUN_DIR), PathBuf::from))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
    pub fn lock(&self) -> PathBuf {
        self.0.join("server.lock")
    }
    pub fn state(&self) -> PathBuf {
        self.0.join("state.json")
    }
    pub fn socket(&self) -> PathBuf {
        self.0.join("control.sock")
    }
    pub fn log(&self) -> PathBuf {
        self.0.join("serve.log")
    }
    pub fn mountpoint(&self) -> PathBuf {
        self.0.join("mnt")
    }

    /// Creates the directory (and its parents), mode 0700.
    pub fn create(&self) -> io::Result<()> {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&self.0)?;
        std::fs::set_permissions(&self.0, std::fs::Permissions::from_mode(0o700))
    }

    /// Takes the server lock, or says who holds it. The lock lasts as long as the file.
    pub fn take_server_lock(&self) -> Result<File, String> {
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.lock())
            .map_err(|e| format!("{}: {e}", self.lock().display()))?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let running = self.read_state().map(|s| format!(" (pid {})", s.pid)).unwrap_or_default();
            return Err(format!(
                "swap is already on{running}: `tiermem swap status` shows it, `tiermem swap off` stops it"
            ));
        }
        Ok(file)
    }

    /// Whether a server holds the lock.
    pub fn server_running(&self) -> bool {
        let Ok(file) = File::open(self.lock()) else { return false };
        // SAFETY: flock on a descriptor we own; the shared lock is dropped with the file.
        let free = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0;
        !free
    }

    pub fn read_state(&self) -> Option<State> {
        let text = std::fs::read_to_string(self.state()).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Writes the state file atomically (a new file renamed over the old).
    pub fn write_state(&self, state: &State) -> io::Result<()> {
        let temporary = self.0.join("state.json.new");
        let mut file = File::create(&temporary)?;
        file.write_all(serde_json::to_string_pretty(state).map_err(io::Error::other)?.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(temporary, self.state())
    }

    pub fn remove_state(&self) {
        let _ = std::fs::remove_file(self.state());
        let _ = std::fs::remove_file(self.socket());
    }
}

/// What a server has set up, as far as undoing it needs.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct State {
    pub pid: u32,
    pub started_unix: u64,
    pub size_bytes: u64,
    pub priority: i32,
    /// `starting`, `ready` or `stopping`.
    pub phase: String,
    pub mountpoint: PathBuf,
    pub mounted: bool,
    pub devices: Vec<StateDevice>,
    /// The file tier's file, removed with the server.
    pub spill: Option<PathBuf>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct StateDevice {
    pub file: PathBuf,
    pub size_bytes: u64,
    pub loop_device: Option<String>,
    pub swap: bool,
}

/// A request on the control socket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// The server's [`StatusReport`], as `{"ok":true,"status":{…}}`.
    Status,
    /// Changes the limits given (left out or `null`: unchanged), in bytes of free VRAM (GAME's
    /// soft and hard limits): below `soft_bytes` free the store takes no more HBM, below
    /// `hard_bytes` free it gives HBM back (moves pages to the file tier). Hard ≤ soft.
    /// Replies with the limits now in force.
    SetLimits {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        soft_bytes: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hard_bytes: Option<u64>,
    },
    /// Forces the store's HBM down to `bytes` (`null`: lifts the cap; the node daemon's grant
    /// in the store) and replies when it is met: `{"ok":true,"cap_bytes":N,"seconds":S,
    /// "moved_bytes":M,"hbm_bytes":H,…}`, `seconds` from the cap to the last page moved down
    /// and its HBM back with the driver (give-back speed = moved_bytes / seconds).
    SetCap {
        #[serde(default)]
        bytes: Option<u64>,
    },
    /// swapoff, detach the loop devices, unmount, exit. Progress lines, then `stopped`.
    Stop,
}

/// What the store says of itself. Fields a store cannot tell are zero or `null`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct StoreReport {
    /// Where the bytes live: the engine's device (CUDA GPU, or the simulated device and why).
    pub backend: String,
    pub size_bytes: u64,
    /// Bytes written and not discarded since (in whole areas).
    pub present_bytes: u64,
    pub hbm_bytes: u64,
    pub host_bytes: u64,
    pub file_bytes: u64,
    /// The soft and hard limits, in bytes of free VRAM (see [`Request::SetLimits`]).
    pub soft_limit_bytes: Option<u64>,
    pub hard_limit_bytes: Option<u64>,
    /// A forced HBM cap (`set_cap`).
    pub cap_bytes: Option<u64>,
    /// Times the store gave HBM back (to its limits, a cap or the node daemon), and how much.
    pub give_backs: u64,
    pub given_back_bytes: u64,
    /// Whatever else the store reports.
    #[serde(default)]
    pub detail: Value,
    /// The node daemon's lease, when the server is its tenant: connected, tenant id, budget.
    #[serde(default)]
    pub daemon: Option<Value>,
}

/// The server's process, as far as safety under memory pressure goes.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ProcessReport {
    pub locked_bytes: Option<u64>,
    /// `ok`, or why not (`EPERM` without `CAP_SYS_RESOURCE`).
    pub io_flusher: String,
    pub oom_score_adj: String,
    pub cgroup: String,
    pub fuse_threads: usize,
}

/// One device: its FUSE file, loop device and swap area.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DeviceStatus {
    pub file: PathBuf,
    pub offset_bytes: u64,
    pub size_bytes: u64,
    pub loop_device: Option<String>,
    /// Its line of `/proc/swaps`, where it is swap.
    pub swap: Option<SwapArea>,
}

/// The reply to `status`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct StatusReport {
    pub pid: u32,
    pub uptime_s: f64,
    pub size_bytes: u64,
    pub priority: i32,
    /// Whether the devices were enabled as swap (`--no-enable` serves them only).
    pub swap_enabled: bool,
    pub mountpoint: PathBuf,
    pub devices: Vec<DeviceStatus>,
    pub store: StoreReport,
    pub requests: Option<IoReport>,
    pub fuse: KernelTerms,
    pub process: ProcessReport,
}

/// Why a call on the control socket failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// No server listens (the socket is missing, refused, or not ours to open).
    Connect(String),
    /// The deadline passed with no (final) reply.
    Timeout,
    /// The server closed the connection without a final reply (it exited).
    Closed,
    /// The server answered with an error.
    Refused(String),
    /// Anything else: an unreadable reply, a broken connection.
    Other(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Connect(e) => write!(f, "no server to talk to: {e}"),
            CallError::Timeout => write!(f, "no reply from the server in time"),
            CallError::Closed => write!(f, "the server closed the connection without replying (did it exit?)"),
            CallError::Refused(e) | CallError::Other(e) => write!(f, "{e}"),
        }
    }
}

impl From<CallError> for String {
    fn from(e: CallError) -> String {
        e.to_string()
    }
}

/// Sends `request` and reads replies until the last: a reply without `progress`. Progress
/// lines go to `progress`. `deadline` bounds the whole call (`None`: no bound).
pub fn call(
    socket: &Path,
    request: &Request,
    deadline: Option<Instant>,
    progress: &mut dyn FnMut(&str),
) -> Result<Value, CallError> {
    let mut stream =
        UnixStream::connect(socket).map_err(|e| CallError::Connect(format!("{}: {e}", socket.display())))?;
    let mut line = serde_json::to_string(request).map_err(|e| CallError::Other(e.to_string()))?;
    line.push('\n');
    stream.write_all(line.as_bytes()).map_err(|e| CallError::Other(format!("{}: {e}", socket.display())))?;
    let mut reader = BufReader::new(stream);
    loop {
        if let Some(deadline) = deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(CallError::Timeout);
            }
            reader.get_ref().set_read_timeout(Some(left)).map_err(|e| CallError::Other(e.to_string()))?;
        }
        let mut reply = String::new();
        match reader.read_line(&mut reply) {
            Ok(0) => return Err(CallError::Closed),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(CallError::Timeout)
            }
            Err(e) => return Err(CallError::Other(format!("reading the server's reply: {e}"))),
        }
        let value: Value = serde_json::from_str(&reply)
            .map_err(|e| CallError::Other(format!("the server's reply {:?}: {e}", reply.trim())))?;
        if value.get("ok") != Some(&Value::Bool(true)) {
            let error = value.get("error").and_then(Value::as_str).unwrap_or("the server said no (no reason given)");
            return Err(CallError::Refused(error.to_string()));
        }
        match value.get("progress").and_then(Value::as_str) {
            Some(line) => progress(line),
            None => return Ok(value),
        }
    }
}

/// Asks for the server's status.
pub fn status(socket: &Path) -> Result<StatusReport, String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let reply = call(socket, &Request::Status, Some(deadline), &mut |_| {})?;
    let status = reply.get("status").cloned().ok_or("the status reply has no \"status\"")?;
    serde_json::from_value(status).map_err(|e| format!("the status reply: {e}"))
}

/// Runs `swapoff` on `device`, calling `progress` about once a second with what is still
/// swapped there (`/proc/swaps` Used).
pub fn swap_off_with_progress(device: &str, progress: &mut dyn FnMut(&str)) -> Result<(), String> {
    let started = Instant::now();
    let device_owned = device.to_string();
    let worker = std::thread::spawn(move || system::swap_off(&device_owned));
    let mut said = started;
    while !worker.is_finished() {
        std::thread::sleep(Duration::from_millis(100));
        if said.elapsed() >= Duration::from_secs(1) {
            said = Instant::now();
            if let Some(area) = system::swap_area(device) {
                progress(&format!(
                    "swapoff {device}: {} still swapped there, {:.0} s",
                    tiermem::format_size(area.used_bytes as usize),
                    started.elapsed().as_secs_f64()
                ));
            }
        }
    }
    worker.join().map_err(|_| "swapoff's thread panicked".to_string())?
}

/// Undoes what a dead server left, from its state file and from the system itself: swap areas
/// on loop devices over files in its mount point are turned off, those loop devices detached,
/// the mount point unmounted, the spill file removed, the state file removed. Stops at the
/// first step that fails (a swap area that cannot be turned off stays, and so does all under
/// it) and says which.
pub fn clean_up_after_dead_server(run: &RunDir, progress: &mut dyn FnMut(&str)) -> Result<(), String> {
    let state = run.read_state();
    let mountpoint = state.as_ref().map_or_else(|| run.mountpoint(), |s| s.mountpoint.clone());
    // Loop devices are found by what backs them: a number in the state file may have been
    // reused by someone else since.
    let loops = system::loops_backed_under(&mountpoint);
    for (device, _) in &loops {
        if system::swap_area(device).is_some() {
            progress(&format!("swapoff {device} (pages the dead server held cannot be read back: their owners get SIGBUS when they touch them)"));
            swap_off_with_progress(device, progress)?;
        }
    }
    for (device, file) in &loops {
        progress(&format!("losetup -d {device} ({})", file.display()));
        system::detach_loop(device)?;
    }
    if system::mount_type(&mountpoint).is_some() {
        progress(&format!("umount {}", mountpoint.display()));
        if let Err(e) = system::unmount(&mountpoint, false) {
            progress(&format!("umount {}: {e}; detaching it lazily", mountpoint.display()));
            system::unmount(&mountpoint, true).map_err(|e| format!("umount -l {}: {e}", mountpoint.display()))?;
        }
    }
    if let Some(spill) = state.as_ref().and_then(|s| s.spill.as_ref()) {
        if spill.exists() {
            progress(&format!("rm {}", spill.display()));
            std::fs::remove_file(spill).map_err(|e| format!("removing the spill file {}: {e}", spill.display()))?;
        }
    }
    run.remove_state();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_on_the_wire() {
        let cases = [
            (Request::Status, r#"{"cmd":"status"}"#),
            (Request::Stop, r#"{"cmd":"stop"}"#),
            (Request::SetLimits { soft_bytes: Some(1), hard_bytes: None }, r#"{"cmd":"set_limits","soft_bytes":1}"#),
            (Request::SetCap { bytes: Some(0) }, r#"{"cmd":"set_cap","bytes":0}"#),
            (Request::SetCap { bytes: None }, r#"{"cmd":"set_cap","bytes":null}"#),
        ];
        for (request, wire) in cases {
            assert_eq!(serde_json::to_string(&request).unwrap(), wire);
            assert_eq!(serde_json::from_str::<Request>(wire).unwrap(), request);
        }
        assert_eq!(serde_json::from_str::<Request>(r#"{"cmd":"set_cap"}"#).unwrap(), Request::SetCap { bytes: None });
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"cmd":"set_limits","hard_bytes":5}"#).unwrap(),
            Request::SetLimits { soft_bytes: None, hard_bytes: Some(5) }
        );
        assert!(serde_json::from_str::<Request>(r#"{"cmd":"reboot"}"#).is_err());
    }

    #[test]
    fn state_round_trips_and_the_lock_says_who_runs() {
        let dir = std::env::temp_dir().join(format!("tiermem-control-test-{}", std::process::id()));
        let run = RunDir::new(&dir);
        run.create().unwrap();
        assert!(!run.server_running());
        let state = State {
            pid: 7,
            phase: "ready".into(),
            devices: vec![StateDevice { loop_device: Some("/dev/loop9".into()), ..Default::default() }],
            ..Default::default()
        };
        run.write_state(&state).unwrap();
        assert_eq!(run.read_state(), Some(state));
        let lock = run.take_server_lock().unwrap();
        assert!(run.server_running());
        let err = run.take_server_lock().unwrap_err();
        assert!(err.contains("already on (pid 7)"), "{err}");
        drop(lock);
        assert!(!run.server_running());
        run.remove_state();
        assert_eq!(run.read_state(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
