//! Shared helpers of the daemon's tests: a temporary directory, a `tiermem daemon` and
//! `tiermem tenant-demo` processes on the simulated device, `tiermem status --json`, and
//! polling for a condition (never a fixed sleep: CI machines are slow and loaded).

#![allow(dead_code)] // each test file uses some of these

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use tiermem_protocol::{ShareStatus, StatusReport};

pub const MIB: u64 = 1 << 20;
/// How long a condition may take to come true on a loaded machine.
pub const PATIENCE: Duration = Duration::from_secs(60);

pub fn tiermem() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tiermem"))
}

/// A directory removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("tiermem-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    pub fn socket(&self) -> PathBuf {
        self.0.join("tiermemd.sock")
    }

    pub fn stop_file(&self) -> PathBuf {
        self.0.join("stop")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process killed when dropped (a failing test leaves nothing running).
pub struct Process(Option<Child>);

impl Process {
    pub fn kill(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill(); // SIGKILL
            let _ = child.wait();
        }
    }

    pub fn pid(&self) -> u32 {
        self.0.as_ref().map_or(0, Child::id)
    }

    /// Waits for the process to end (however it ends) and returns how it ended.
    pub fn wait(&mut self) -> std::process::ExitStatus {
        self.0.take().map(|mut child| child.wait().unwrap()).unwrap()
    }

    /// Waits for the process to exit by itself and returns its output.
    pub fn finish(mut self) -> Output {
        self.0.take().map(|child| child.wait_with_output().unwrap()).unwrap()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `tiermem daemon` with `config` on the directory's socket and waits until it answers.
pub fn start_daemon(dir: &TempDir, config: &str) -> Process {
    let config_path = dir.0.join("tiermemd.toml");
    std::fs::write(&config_path, config).unwrap();
    let child = tiermem()
        .args(["daemon", "--config"])
        .arg(&config_path)
        .arg("--socket")
        .arg(dir.socket())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let daemon = Process(Some(child));
    wait_for("the daemon to answer", || status(&dir.socket()).is_some());
    daemon
}

/// Starts a `tiermem tenant-demo` on the simulated device, linked to the directory's daemon.
pub fn start_tenant(dir: &TempDir, label: Option<&str>, args: &[&str]) -> Process {
    start_tenant_with(dir, label, args, &[])
}

/// [`start_tenant`] with more environment variables.
pub fn start_tenant_with(dir: &TempDir, label: Option<&str>, args: &[&str], env: &[(&str, &str)]) -> Process {
    let mut command = tiermem();
    command
        .arg("tenant-demo")
        .args(args)
        .arg("--stop-file")
        .arg(dir.stop_file())
        .env("TIERMEM_DAEMON", dir.socket())
        .env("TIERMEM_BACKEND", "sim")
        .env("TIERMEM_SIM_HBM", "128MiB")
        .env("TIERMEM_HOST_LIMIT", "512MiB")
        .env_remove("TIERMEM_HBM_LIMIT")
        .env_remove("TIERMEM_FILE")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    match label {
        Some(label) => command.env("TIERMEM_LABEL", label),
        None => command.env_remove("TIERMEM_LABEL"),
    };
    Process(Some(command.spawn().unwrap()))
}

/// Starts `tiermem lend --gpu 1` on a simulated node of two GPUs, lending `offer` through the
/// directory's daemon.
pub fn start_lender(dir: &TempDir, offer: &str) -> Process {
    let child = tiermem()
        .args(["lend", "--gpu", "1", "--reserve", "0", "--offer", offer, "--socket"])
        .arg(dir.socket())
        .env("TIERMEM_BACKEND", "sim")
        .env("TIERMEM_SIM_GPUS", "2")
        .env("TIERMEM_SIM_HBM", "256MiB")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    Process(Some(child))
}

/// `tiermem status --json`, or None while no daemon answers.
pub fn status(socket: &Path) -> Option<StatusReport> {
    let out = tiermem().args(["status", "--json", "--socket"]).arg(socket).output().unwrap();
    if !out.status.success() {
        return None;
    }
    Some(serde_json::from_slice(&out.stdout).unwrap())
}

/// The HBM shares of GPU 0, by tenant name then id.
pub fn hbm_shares(report: &StatusReport) -> Vec<(String, ShareStatus)> {
    let Some(pool) = report.pools.iter().find(|p| p.gpu == Some(0)) else { return Vec::new() };
    let name = |id| report.tenants.iter().find(|t| t.tenant == id).map_or("?".into(), |t| t.name.clone());
    let mut shares: Vec<(String, ShareStatus)> = pool.shares.iter().map(|s| (name(s.tenant), s.clone())).collect();
    shares.sort_by(|a, b| (&a.0, a.1.tenant).cmp(&(&b.0, b.1.tenant)));
    shares
}

/// Polls `condition` until it holds; fails the test after [`PATIENCE`].
pub fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the daemon's HBM shares satisfy `settled`; returns them.
pub fn wait_for_shares(
    socket: &Path,
    what: &str,
    settled: impl Fn(&[(String, ShareStatus)]) -> bool,
) -> Vec<(String, ShareStatus)> {
    let mut last = Vec::new();
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(report) = status(socket) {
            last = hbm_shares(&report);
            if settled(&last) {
                return last;
            }
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}; last shares: {last:#?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Ends the tenants (the stop file) and checks each exits 0 having verified every byte.
pub fn stop_and_verify(dir: &TempDir, tenants: Vec<Process>) -> Vec<serde_json::Value> {
    std::fs::write(dir.stop_file(), b"").unwrap();
    tenants
        .into_iter()
        .map(|tenant| {
            let out = tenant.finish();
            assert!(out.status.success(), "a tenant failed: {}", String::from_utf8_lossy(&out.stdout));
            let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert!(report["verified_bytes"].as_u64().unwrap() > 0, "{report}");
            assert_eq!(report["linked"], true, "{report}");
            report
        })
        .collect()
}
