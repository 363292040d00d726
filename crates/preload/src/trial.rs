//! Stage 3 on trial: whether following the program's cycles (paging within a step at pauses,
//! cycle.rs) pays, measured on the program itself.
//!
//! Stage 3 made a training loop four times faster than stage 2 alone at 0.7× its peak on the
//! H200, and a decoder 13% slower at 0.5× (BENCHMARKS.md, fortieth session): a decoder reads
//! each weight once a token, so a weight paged up within the token costs its copy both ways
//! where reading it in place costs one pass over the link, while stage 2's heat keeps the
//! weights read most in HBM. Which one a program is cannot be told from its launches, so the
//! program is timed under both: a few of its cycles followed, then a few left to stage 2, each
//! sample a cycle's wall time (from the synchronization that began it to the one that ended it,
//! the moves made there included) per launch, so cycles of different lengths compare. Stage 2
//! is kept only if its median is clearly faster ([`KEEP_HOTNESS_BELOW`]); a sample of stage 2
//! far slower than stage 3's median ends its trial at once ([`ABORT_ABOVE`]), so a training
//! loop pays one slow step for it. The choice is tried again every [`RETRY_AFTER`] samples (a
//! program's phases change: prefill then decoding, training then evaluation).
//!
//! Only cycles that matter are samples: cycles of at least [`MIN_LAUNCHES`] launches while the
//! program's memory exceeds its budget (cycle.rs). Under stage 3 a cycle that diverged from its
//! recording counts too: a program whose cycles often diverge gets that much from stage 3.
//! Pure and deterministic: the caller passes the times.

/// What places the chunks during the next cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Stage 3: the cycle's plan, paged at pauses.
    Segments,
    /// Stage 2 alone: hotness at the synchronizations.
    Hotness,
}

/// Samples skipped after each change of mode: the first cycle after one moves what the other
/// mode had placed, and stage 3's first plan is made from a cycle not yet followed.
const SETTLE: u32 = 1;
/// Samples taken in each mode.
const SAMPLES: usize = 3;
/// Stage 2 is kept when its median is below this share of stage 3's.
pub const KEEP_HOTNESS_BELOW: f64 = 0.93;
/// A sample of stage 2 above this multiple of stage 3's median ends its trial.
pub const ABORT_ABOVE: f64 = 1.5;
/// Samples after a choice before the next trial.
pub const RETRY_AFTER: u32 = 512;
/// Launches a cycle must have to be a sample.
pub const MIN_LAUNCHES: usize = 16;

#[derive(Debug)]
enum Phase {
    /// Timing `mode`, `settle` samples still to skip; `samples` taken so far.
    Timing { mode: Mode, settle: u32, samples: Vec<f64> },
    /// Chosen; `left` samples before the next trial.
    Chosen { mode: Mode, left: u32 },
}

/// The trial's state (module documentation).
#[derive(Debug)]
pub struct Trial {
    phase: Phase,
    /// Stage 3's median in the trial under way, seconds per launch.
    segments_median: Option<f64>,
    /// Trials that kept stage 3, and that chose stage 2.
    pub kept_segments: u32,
    pub chose_hotness: u32,
}

impl Default for Trial {
    fn default() -> Self {
        Self::new()
    }
}

fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

impl Trial {
    pub const fn new() -> Self {
        Trial {
            phase: Phase::Timing { mode: Mode::Segments, settle: SETTLE, samples: Vec::new() },
            segments_median: None,
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
    /// began it, `launches` launched. The mode for the next cycle.
    pub fn ended(&mut self, seconds: f64, launches: usize) -> Mode {
        if launches < MIN_LAUNCHES {
            return self.mode();
        }
        let sample = seconds / launches as f64;
        match &mut self.phase {
            Phase::Chosen { left, .. } => {
                *left = left.saturating_sub(1);
                if *left == 0 {
                    self.restart();
                }
            }
            Phase::Timing { settle, .. } if *settle > 0 => *settle -= 1,
            Phase::Timing { mode: Mode::Segments, samples, .. } => {
                samples.push(sample);
                if samples.len() == SAMPLES {
                    self.segments_median = Some(median(samples));
                    self.phase = Phase::Timing { mode: Mode::Hotness, settle: 0, samples: Vec::new() };
                }
            }
            Phase::Timing { mode: Mode::Hotness, samples, .. } => {
                let segments = self.segments_median.unwrap_or(f64::INFINITY);
                samples.push(sample);
                if sample > ABORT_ABOVE * segments {
                    self.choose(Mode::Segments);
                } else if samples.len() == SAMPLES {
                    let faster = median(samples) < KEEP_HOTNESS_BELOW * segments;
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
        self.phase = Phase::Timing { mode: Mode::Segments, settle: SETTLE, samples: Vec::new() };
        self.segments_median = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs cycles of 100 launches whose seconds depend on the mode they ran in; the modes.
    fn run(trial: &mut Trial, cycles: usize, seconds: impl Fn(Mode) -> f64) -> Vec<Mode> {
        (0..cycles)
            .map(|_| {
                let mode = trial.mode();
                trial.ended(seconds(mode), 100);
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
        assert_eq!(modes[SETTLE as usize + SAMPLES], Mode::Hotness);
        assert_eq!((trial.kept_segments, trial.chose_hotness, trial.mode()), (1, 0, Mode::Segments));
    }

    #[test]
    fn a_decoder_faster_under_stage_2_keeps_it() {
        let mut trial = Trial::new();
        let modes = run(&mut trial, 40, |mode| if mode == Mode::Segments { 0.030 } else { 0.026 });
        let first_hotness = SETTLE as usize + SAMPLES;
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
            assert_eq!(trial.ended(5.0, MIN_LAUNCHES - 1), Mode::Segments);
        }
        assert_eq!((trial.kept_segments, trial.chose_hotness), (0, 0));
    }

    #[test]
    fn the_choice_is_tried_again_and_may_change() {
        let mut trial = Trial::new();
        run(&mut trial, 10, |mode| if mode == Mode::Segments { 1.0 } else { 0.5 });
        assert_eq!(trial.mode(), Mode::Hotness);
        // The program changes: stage 2 becomes the slow one.
        let modes = run(&mut trial, RETRY_AFTER as usize + 10, |mode| if mode == Mode::Segments { 1.0 } else { 3.0 });
        assert_eq!(trial.mode(), Mode::Segments, "{:?}", &modes[modes.len() - 12..]);
        assert_eq!((trial.chose_hotness, trial.kept_segments), (1, 1));
    }

    #[test]
    fn samples_are_per_launch() {
        // Stage 2's cycles are twice as long but have twice the launches: as fast.
        let mut trial = Trial::new();
        for _ in 0..20 {
            let (seconds, launches) = if trial.mode() == Mode::Segments { (1.0, 100) } else { (1.5, 200) };
            trial.ended(seconds, launches);
        }
        assert_eq!((trial.mode(), trial.chose_hotness), (Mode::Hotness, 1));
    }
}
