//! cgroups v2 for the swap-bound jobs: a folder of the benchmark's own with the memory
//! controller, a child per job with its `memory.max`; every process left in them killed and
//! the folders removed on drop.

use super::{read_trim, warn_if_failed, write_file, PREFIX};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

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
            warn_if_failed(remove_cgroup(&child));
        }
        warn_if_failed(remove_cgroup(&self.path));
    }
}
