//! The hung-task watch: every task's state sampled on a thread of its own while a part runs
//! on the VRAM device, counting tasks that stay in uninterruptible sleep (state D) and keeping
//! the kernel stacks of those stuck longest.

use super::read_trim;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    fn a_task_stat_line_gives_state_and_name() {
        assert_eq!(parse_stat("42 (kworker/u8:1) D 2 0 0"), Some(('D', "kworker/u8:1".into())));
        assert_eq!(parse_stat("7 (a (b) c) S 1 7"), Some(('S', "a (b) c".into())));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn the_hung_task_watch_runs_and_stops() {
        let watch = HungWatch::start();
        std::thread::sleep(Duration::from_millis(300));
        let report = watch.finish();
        assert!(report.samples >= 1);
    }
}
