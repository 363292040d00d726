//! The throughput sets of `bench tenants`, repeated and alternated (`--repeats`, 3 by default):
//! static thirds, tiermemd sharing working sets in turns, tiermemd fair, one after another with
//! the whole cap — then all four again. Each mode's throughput is the median of its repeats,
//! and the ratios are ratios of medians; every repeat's throughput is in the report (`…_runs`)
//! and every repeat's jobs in the detail (`repeat` says which). One run of each is not enough:
//! on one H200 machine static thirds gave 54.0 to 57.8 GB/s in three runs, on another 58.0 to
//! 60.3 (BENCHMARKS.md, thirtieth and thirty-first sessions) — a spread as wide as the margin
//! `vs_static` is judged by. Alternating the modes spreads any drift of the machine over all.

use super::super::median;
use super::{run_set, spawn_daemon, speeds, Job, Mode, Outcome, Setup};
use std::path::Path;

/// One mode's repeats: each the jobs' outcomes and the set's wall time.
#[derive(Default)]
pub(super) struct Runs(Vec<(Vec<Outcome>, f64)>);

impl Runs {
    /// GB/s of each repeat: the bytes its jobs worked on ÷ its wall time.
    pub fn throughputs(&self) -> Vec<f64> {
        self.0.iter().map(|(outcomes, wall)| outcomes.iter().map(|o| o.bytes).sum::<f64>() / wall / 1e9).collect()
    }

    /// The median throughput (GB/s).
    pub fn throughput(&self) -> f64 {
        median(self.throughputs())
    }

    /// The median wall time (s).
    pub fn wall(&self) -> f64 {
        median(self.0.iter().map(|(_, wall)| *wall).collect())
    }

    /// Whether every job of every repeat finished with every byte.
    pub fn all_ok(&self) -> bool {
        self.0.iter().flat_map(|(outcomes, _)| outcomes).all(|o| o.ok)
    }

    /// Every repeat's jobs for the detail JSON, each marked with its repeat.
    pub fn detail(&self) -> Vec<serde_json::Value> {
        let mut all = Vec::new();
        for (repeat, (outcomes, _)) in self.0.iter().enumerate() {
            for mut job in speeds(outcomes) {
                job["repeat"] = repeat.into();
                all.push(job);
            }
        }
        all
    }
}

/// The four modes' repeats.
#[derive(Default)]
pub(super) struct Sets {
    pub static_thirds: Runs,
    pub working_sets: Runs,
    pub fair: Runs,
    pub serial: Runs,
}

impl Sets {
    pub fn all_ok(&self) -> bool {
        [&self.static_thirds, &self.working_sets, &self.fair, &self.serial].iter().all(|r| r.all_ok())
    }
}

/// Runs `set` `setup.repeats` times in each mode, alternating, and says each run's throughput.
pub(super) fn measure(setup: &Setup, scratch: &Path, set: &[Job]) -> Result<Sets, String> {
    let cap = setup.cap;
    let mut sets = Sets::default();
    let say = |what: &str, runs: &Runs, repeat: usize| {
        let (gbps, wall) = (runs.throughputs()[repeat], runs.0[repeat].1);
        println!("{what}: {gbps:.2} GB/s over {wall:.1} s (repeat {} of {})", repeat + 1, setup.repeats);
    };
    for repeat in 0..setup.repeats {
        sets.static_thirds.0.push(run_set(setup, scratch, set, &Mode::Static(cap / 3))?);
        say("static thirds", &sets.static_thirds, repeat);
        let in_turns = spawn_daemon(scratch, cap, setup, "working-sets")?;
        sets.working_sets.0.push(run_set(setup, scratch, set, &Mode::Daemon(in_turns.socket.clone()))?);
        drop(in_turns);
        say("tiermemd, working sets in turns", &sets.working_sets, repeat);
        let fair = spawn_daemon(scratch, cap, setup, "fair")?;
        sets.fair.0.push(run_set(setup, scratch, set, &Mode::Daemon(fair.socket.clone()))?);
        drop(fair);
        say("tiermemd", &sets.fair, repeat);
        let (mut serial, mut wall_serial) = (Vec::new(), 0.0);
        for job in set {
            let (outcomes, wall) = run_set(setup, scratch, std::slice::from_ref(job), &Mode::Static(cap))?;
            serial.extend(outcomes);
            wall_serial += wall;
        }
        sets.serial.0.push((serial, wall_serial));
        say("serial, whole cap each", &sets.serial, repeat);
    }
    Ok(sets)
}
