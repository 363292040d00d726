//! Stage 3 on trial: whether following the program's cycles (paging within a step at pauses,
//! cycle.rs) pays, measured on the program itself.
//!
//! Stage 3 made a training loop four times faster than stage 2 alone at 0.7× its peak on the
//! H200, and a decoder 13% slower at 0.5× (BENCHMARKS.md, fortieth session): a decoder reads
//! each weight once a token, so a weight paged up within the token costs its copy both ways
//! where reading it in place costs one pass over the link, while stage 2's heat keeps the
//! weights read most in HBM. Which one a program is cannot be told from its launches, so the
//! program is timed under both: a few of its cycles followed, then a few left to stage 2, each
//! mode's pace its cycles' wall time (each from the synchronization that began it to the one
//! that ended it, the moves made there included) over their launches, so that cycles of
//! different lengths compare. Stage 2
//! is kept only if its pace is clearly faster ([`KEEP_HOTNESS_BELOW`]); stage 2's trial ends
//! as soon as its pace so far is far slower than stage 3's ([`ABORT_ABOVE`]), so a training
//! loop pays about one slow step for it. The choice is tried again every [`RETRY_AFTER`] samples (a
//! program's phases change: prefill then decoding, training then evaluation).
//!
//! Only cycles that matter are samples: cycles of at least [`MIN_LAUNCHES`] launches while the
//! program's memory exceeds its budget (cycle.rs), and under stage 3 those followed to their
//! end, after the first [`SETTLE_SEGMENTS`]: stage 3 learns a program over its first cycles (on
//! the H200 the training loop's first three steps at 0.7× took 2.2–3.1 s, the next 0.6 s), and
//! a trial that timed those chose stage 2 for a loop it made four times slower. A program whose
//! cycles stage 3 cannot follow ([`UNFOLLOWED`] in a row diverged) is timed as it runs.
//! Pure and deterministic: the caller passes the times.

/// What places the chunks during the next cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Stage 3: the cycle's plan, paged at pauses.
    Segments,
    /// Stage 2 alone: hotness at the synchronizations.
    Hotness,
}

/// Stage 3's followed cycles skipped before its samples (module documentation).
const SETTLE_SEGMENTS: u32 = 2;
/// Cycles under stage 3 in a row not followed to their end after which they count.
const UNFOLLOWED: u32 = 8;
/// Cycles timed in each mode: a window over several steps of a program that synchronizes a few
/// times a step, each mode's pace its cycles' seconds over their launches, all together.
const SAMPLES: u32 = 6;
/// Stage 2 is kept when its pace is below this share of stage 3's.
pub const KEEP_HOTNESS_BELOW: f64 = 0.93;
/// Stage 2's trial ends as soon as its pace so far is above this multiple of stage 3's.
pub const ABORT_ABOVE: f64 = 1.5;
/// Samples after a choice before the next trial.
pub const RETRY_AFTER: u32 = 512;
/// Launches a cycle must have to be a sample.
pub const MIN_LAUNCHES: usize = 16;

/// Seconds and launches of the cycles timed in one mode.
#[derive(Clone, Copy, Debug, Default)]
struct Pace {
    cycles: u32,
    seconds: f64,
    launches: f64,
}

impl Pace {
    fn add(&mut self, seconds: f64, launches: usize) {
        self.cycles += 1;
        self.seconds += seconds;
        self.launches += launches as f64;
    }

    /// Seconds per launch.
    fn per_launch(&self) -> f64 {
        self.seconds / self.launches.max(1.0)
    }
}

#[derive(Debug)]
enum Phase {
    /// Timing `mode`, `settle` samples still to skip.
    Timing { mode: Mode, settle: u32, pace: Pace },
    /// Chosen; `left` samples before the next trial.
    Chosen { mode: Mode, left: u32 },
}

/// The trial's state (module documentation).
#[derive(Debug)]
pub struct Trial {
    phase: Phase,
    /// Cycles under stage 3 in a row not followed to their end.
    unfollowed: u32,
    /// Stage 3's pace in the trial under way, seconds per launch.
    segments: f64,
    /// Trials that kept stage 3, and that chose stage 2.
    pub kept_segments: u32,
    pub chose_hotness: u32,
}

impl Default for Trial {
    fn default() -> Self {
        Self::new()
    }
}

const NO_PACE: Pace = Pace { cycles: 0, seconds: 0.0, launches: 0.0 };

impl Trial {
    pub const fn new() -> Self {
        Trial {
            phase: Phase::Timing { mode: Mode::Segments, settle: SETTLE_SEGMENTS, pace: NO_PACE },
            unfollowed: 0,
            segments: f64::INFINITY,
            kept_segments: 0,
            chose_hotness: 0,
        }
    }

    /// The mode the next cycle runs in.
    pub fn mode(&self) -> Mode {
        match &self.phase {
            Phase::Timing { mode, .. } | Phase::Chosen { mode, .. } => *mode,
        }
    }

    /// A cycle that ran in [`Trial::mode`] ended: `seconds` from the synchronization that
    /// began it, `launches` launched, `followed` to its end by stage 3's plan. The mode for the
    /// next cycle.
    pub fn ended(&mut self, seconds: f64, launches: usize, followed: bool) -> Mode {
        if launches < MIN_LAUNCHES {
            return self.mode();
        }
        if matches!(self.phase, Phase::Timing { mode: Mode::Segments, .. }) {
            self.unfollowed = if followed { 0 } else { self.unfollowed + 1 };
            if self.unfollowed > 0 && self.unfollowed < UNFOLLOWED {
                return self.mode();
            }
        }
        match &mut self.phase {
            Phase::Chosen { left, .. } => {
                *left = left.saturating_sub(1);
                if *left == 0 {
                    self.restart();
                }
            }
            Phase::Timing { settle, .. } if *settle > 0 => *settle -= 1,
            Phase::Timing { mode: Mode::Segments, pace, .. } => {
                pace.add(seconds, launches);
                if pace.cycles == SAMPLES {
                    self.segments = pace.per_launch();
                    self.phase = Phase::Timing { mode: Mode::Hotness, settle: 0, pace: NO_PACE };
                }
            }
            Phase::Timing { mode: Mode::Hotness, pace, .. } => {
                pace.add(seconds, launches);
                let hotness = pace.per_launch();
                if hotness > ABORT_ABOVE * self.segments {
                    self.choose(Mode::Segments);
                } else if pace.cycles == SAMPLES {
                    let faster = hotness < KEEP_HOTNESS_BELOW * self.segments;
                    self.choose(if faster { Mode::Hotness } else { Mode::Segments });
                }
            }
        }
        self.mode()
    }

    fn choose(&mut self, mode: Mode) {
        match mode {
            Mode::Segments => self.kept_segments += 1,
            Mode::Hotness => self.chose_hotness += 1,
        }
        self.phase = Phase::Chosen { mode, left: RETRY_AFTER };
    }

    /// A new trial, from stage 3.
    fn restart(&mut self) {
        *self = Trial { kept_segments: self.kept_segments, chose_hotness: self.chose_hotness, ..Trial::new() };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs cycles of 100 launches, each followed to its end, whose seconds depend on the mode
    /// they ran in; the modes.
    fn run(trial: &mut Trial, cycles: usize, seconds: impl Fn(Mode) -> f64) -> Vec<Mode> {
        (0..cycles)
            .map(|_| {
                let mode = trial.mode();
                trial.ended(seconds(mode), 100, true);
                mode
            })
            .collect()
    }

    #[test]
    fn a_training_loop_pays_one_cycle_of_stage_2_and_keeps_stage_3() {
        let mut trial = Trial::new();
        let modes = run(&mut trial, 40, |mode| if mode == Mode::Segments { 0.6 } else { 2.4 });
        let hotness = modes.iter().filter(|&&m| m == Mode::Hotness).count();
        assert_eq!(hotness, 1, "{modes:?}");
        assert_eq!(modes[(SETTLE_SEGMENTS + SAMPLES) as usize], Mode::Hotness);
        assert_eq!((trial.kept_segments, trial.chose_hotness, trial.mode()), (1, 0, Mode::Segments));
    }

    #[test]
    fn stage_3s_first_cycles_are_not_its_samples() {
        // The training loop at 0.7× on the H200 (fortieth session): the first step recorded
        // and not followed, the next two followed but still learning, then 0.6 s a step; stage
        // 2 alone 2.2–2.4 s a step. Timing the first steps chose stage 2.
        let mut trial = Trial::new();
        let mut modes = Vec::new();
        for (cycle, (seconds, followed)) in [(3.0, false), (2.5, true), (2.2, true)].into_iter().enumerate() {
            modes.push(trial.mode());
            trial.ended(seconds, 100, followed);
            assert_eq!(trial.mode(), Mode::Segments, "cycle {cycle}");
        }
        modes.extend(run(&mut trial, 20, |mode| if mode == Mode::Segments { 0.6 } else { 2.3 }));
        assert_eq!(modes.iter().filter(|&&m| m == Mode::Hotness).count(), 1, "{modes:?}");
        assert_eq!((trial.mode(), trial.kept_segments, trial.chose_hotness), (Mode::Segments, 1, 0));
    }

    #[test]
    fn cycles_stage_3_cannot_follow_are_timed_as_they_run() {
        // Every cycle diverges: after a few in a row they are stage 3's samples.
        let mut trial = Trial::new();
        for _ in 0..30 {
            let seconds = if trial.mode() == Mode::Segments { 1.0 } else { 0.5 };
            trial.ended(seconds, 100, false);
        }
        assert_eq!((trial.mode(), trial.chose_hotness), (Mode::Hotness, 1));
        // Diverging now and then: those cycles are not samples.
        let mut trial = Trial::new();
        for cycle in 0..30 {
            let followed = cycle % 3 != 0;
            let seconds = if !followed {
                9.0
            } else if trial.mode() == Mode::Segments {
                1.0
            } else {
                0.98
            };
            trial.ended(seconds, 100, followed);
        }
        assert_eq!((trial.mode(), trial.kept_segments), (Mode::Segments, 1));
    }

    #[test]
    fn a_decoder_faster_under_stage_2_keeps_it() {
        let mut trial = Trial::new();
        let modes = run(&mut trial, 40, |mode| if mode == Mode::Segments { 0.030 } else { 0.026 });
        let first_hotness = (SETTLE_SEGMENTS + SAMPLES) as usize;
        assert!(modes[..first_hotness].iter().all(|&m| m == Mode::Segments), "{modes:?}");
        assert!(modes[first_hotness..].iter().all(|&m| m == Mode::Hotness), "{modes:?}");
        assert_eq!((trial.kept_segments, trial.chose_hotness), (0, 1));
    }

    #[test]
    fn a_difference_within_the_noise_keeps_stage_3() {
        let mut trial = Trial::new();
        run(&mut trial, 20, |mode| if mode == Mode::Segments { 1.0 } else { 0.97 });
        assert_eq!((trial.mode(), trial.kept_segments), (Mode::Segments, 1));
    }

    #[test]
    fn short_cycles_change_nothing() {
        let mut trial = Trial::new();
        for _ in 0..100 {
            assert_eq!(trial.ended(5.0, MIN_LAUNCHES - 1, true), Mode::Segments);
        }
        assert_eq!((trial.kept_segments, trial.chose_hotness), (0, 0));
    }

    #[test]
    fn the_choice_is_tried_again_and_may_change() {
        let mut trial = Trial::new();
        run(&mut trial, 20, |mode| if mode == Mode::Segments { 1.0 } else { 0.5 });
        assert_eq!((trial.mode(), trial.chose_hotness), (Mode::Hotness, 1));
        // The program changes: stage 2 becomes the slow one.
        let modes = run(&mut trial, RETRY_AFTER as usize + 20, |mode| if mode == Mode::Segments { 1.0 } else { 3.0 });
        assert_eq!(trial.mode(), Mode::Segments, "{:?}", &modes[modes.len() - 12..]);
        assert_eq!((trial.chose_hotness, trial.kept_segments), (1, 1));
    }

    #[test]
    fn samples_are_per_launch() {
        // Stage 2's cycles take 1.5 times as long but launch twice as much: faster per launch.
        let mut trial = Trial::new();
        for _ in 0..20 {
            let (seconds, launches) = if trial.mode() == Mode::Segments { (1.0, 100) } else { (1.5, 200) };
            trial.ended(seconds, launches, true);
        }
        assert_eq!((trial.mode(), trial.chose_hotness), (Mode::Hotness, 1));
    }
}
