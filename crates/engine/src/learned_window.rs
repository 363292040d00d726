//! The window a loop learned from acquires pages ahead (`TIERMEM_LEARN_LOOPS`): a fixed number
//! of bytes, or, with `TIERMEM_TUNE_WINDOW=on`, tuned pass by pass by the policy's
//! [`WindowTuner`] from how long each pass took and how long its acquires waited
//! (`tiermem_policy::window` says why and how). Either way at most a share of the HBM budget
//! the caller passes in.
//!
//! This is the mechanism's half: it notes when a pass begins (the loop's first step) and the
//! engine's running total of waits then, and hands the tuner each pass that ended.

use std::time::Instant;
use tiermem_policy::{Pass, WindowTuner};

/// A fixed window is at most this share of the HBM budget (as tiermem.torch's): each of its
/// bytes costs a byte of traffic a pass, unmeasured.
const FIXED_SHARE: usize = 8;

/// A tuned window is at most this share: it grows only while its passes get faster.
const TUNED_SHARE: usize = 4;

#[derive(Debug)]
pub(crate) struct LearnedWindow {
    bytes: usize,
    tuning: Option<Tuning>,
}

#[derive(Debug)]
struct Tuning {
    tuner: WindowTuner,
    /// When the pass under way began, and the engine's waits (ms) until then.
    began: Option<(Instant, f64)>,
}

impl LearnedWindow {
    /// A window of `bytes`, tuned from there if `tune`.
    pub fn new(bytes: usize, tune: bool) -> Self {
        Self { bytes, tuning: tune.then(|| Tuning { tuner: WindowTuner::new(), began: None }) }
    }

    /// The window for step `step` of the loop under an HBM budget of `budget` bytes. At step 0
    /// a pass begins: the one that ended, measured against `waited_ms` (the engine's running
    /// total of page-in and eviction waits), tunes the window first.
    pub fn at_step(&mut self, step: usize, budget: usize, waited_ms: f64) -> usize {
        let (fixed, cap) = self.bounds(budget);
        let Some(tuning) = self.tuning.as_mut() else { return fixed };
        if step == 0 {
            let now = Instant::now();
            if let Some((began, waited_before)) = tuning.began.replace((now, waited_ms)) {
                let pass = Pass {
                    seconds: now.duration_since(began).as_secs_f64(),
                    waited: (waited_ms - waited_before).max(0.0) / 1e3,
                };
                tuning.tuner.pass_ended(pass, fixed, cap);
            }
        }
        tuning.tuner.window(fixed, cap)
    }

    /// The window under an HBM budget of `budget` bytes now.
    pub fn now(&self, budget: usize) -> usize {
        let (fixed, cap) = self.bounds(budget);
        self.tuning.as_ref().map_or(fixed, |t| t.tuner.window(fixed, cap))
    }

    /// The fixed window under `budget` (the configured bytes, at most [`FIXED_SHARE`] of it)
    /// and the most a tuned one may grow to ([`TUNED_SHARE`] of it). Every byte of window is a
    /// byte of HBM the loop's kept set gives up, so a window larger than the budget (a tenant
    /// whose share shrank) does not turn Belady into streaming everything.
    fn bounds(&self, budget: usize) -> (usize, usize) {
        (self.bytes.min(budget / FIXED_SHARE), budget / TUNED_SHARE)
    }

    /// A new loop is learned (or none is followed): its passes are measured afresh.
    pub fn forget_passes(&mut self) {
        if let Some(tuning) = self.tuning.as_mut() {
            *tuning = Tuning { tuner: WindowTuner::new(), began: None };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn a_fixed_window_is_the_configured_bytes_within_an_eighth_of_the_budget() {
        let mut w = LearnedWindow::new(256 * MIB, false);
        assert_eq!(w.at_step(0, 8192 * MIB, 0.0), 256 * MIB);
        assert_eq!(w.at_step(0, 8192 * MIB, 1e6), 256 * MIB, "waits change nothing");
        assert_eq!(w.at_step(3, 1024 * MIB, 0.0), 128 * MIB);
    }

    #[test]
    fn a_tuned_window_deepens_after_passes_that_waited() {
        let mut w = LearnedWindow::new(256 * MIB, true);
        let budget = 4096 * MIB;
        // Passes of a few milliseconds that spent all their time waiting (the waits' total
        // grows by a second a pass, more than any pass lasts).
        let mut waited = 0.0;
        for _ in 0..2 {
            assert_eq!(w.at_step(0, budget, waited), 256 * MIB);
            assert_eq!(w.at_step(1, budget, waited), 256 * MIB, "only a pass's first step tunes");
            std::thread::sleep(std::time::Duration::from_millis(2));
            waited += 1e3;
        }
        assert_eq!(w.at_step(0, budget, waited), 512 * MIB, "the second whole pass waited: a trial");
        assert_eq!(w.now(budget), 512 * MIB);
        w.forget_passes();
        assert_eq!(w.now(budget), 256 * MIB);
    }
}
