//! How far a learned loop pages ahead, tuned by the passes it makes (`TIERMEM_TUNE_WINDOW`).
//!
//! A loop learned from acquires pages ahead a fixed window (256 MiB by default, at most an
//! eighth of the HBM budget). Every byte of window costs a byte of traffic per pass (the
//! resident set gives it up), so the window is small. But freeing a slot and filling it is a
//! chain — the victim's copy down, then the page-in — and when the program's steps come
//! faster than that chain, a window of a few steps is too shallow: each page-in waits for its
//! victim's copy although the link is mostly idle. On the H200 a job that streamed 128 MiB
//! buffers with 2 ms of work each waited 2.4 ms per buffer, a third of its time
//! (BENCHMARKS.md, thirty-second session). A deeper window hides the chain; in a loop bound
//! by the link it only adds traffic. Which of the two a loop is, is measured, not modelled:
//!
//! * It starts at the fixed window (the engine's: its configured bytes, at most an eighth of
//!   the budget).
//! * A pass in which the program waited for page-ins and evictions for more than
//!   [`WAITING_SHARE`] of its time starts a **trial**: the window doubles, up to `cap` (the
//!   engine's: a quarter of the budget).
//! * The trial's second pass (its first moves what the deeper window gives up, once) **keeps**
//!   the larger window if it was at least [`GAIN`] faster than the pass before the trial;
//!   otherwise the window goes back and no trial starts for [`HOLD_PASSES`] passes (a loop
//!   bound by the link stays where it was).
//! * A kept window that still waits tries again, so the window climbs while that pays.
//! * A **new budget** (a new fixed window or cap: the loop's balance changed) starts over from
//!   the fixed window: passes under different budgets are not compared.
//!   Under one budget a kept window is never given back: a loop that becomes bound by the link
//!   later (another process started paging beside it) pays at most the cap's bytes of traffic a
//!   pass for it.
//!
//! Pure and deterministic: the engine says when a pass ended, how long it took and how long
//! it waited; the tuner answers with the window.

/// A pass that waited longer than this share of its time tries a deeper window.
pub const WAITING_SHARE: f64 = 0.05;

/// A trial's measured pass must be this much faster than the pass before the trial to keep
/// its window.
pub const GAIN: f64 = 0.03;

/// Passes without a trial after a trial that did not pay.
pub const HOLD_PASSES: u32 = 16;

/// One pass of the loop, as the engine measured it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pass {
    /// From the pass's first step to the next pass's first step.
    pub seconds: f64,
    /// Of which the program's acquires waited for page-ins and evictions.
    pub waited: f64,
}

/// How far a learned loop pages ahead (module docs): the fixed window, doubled as many times
/// as paid, within a cap. The engine passes both in bytes at each call (they follow the budget).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WindowTuner {
    doublings: u32,
    /// The (fixed window, cap) the passes were measured under.
    under: Option<(usize, usize)>,
    /// A trial in progress: the doublings it grew from, the pass before it (seconds), and
    /// whether its first pass (the change's own) is still to end.
    trial: Option<(u32, f64, bool)>,
    /// Passes left before the next trial may start.
    hold: u32,
}

impl WindowTuner {
    pub fn new() -> Self {
        Self::default()
    }

    /// The window to page ahead: `fixed` doubled as tuned, at most `cap`.
    pub fn window(&self, fixed: usize, cap: usize) -> usize {
        let doubled = fixed.checked_shl(self.doublings).filter(|d| d >> self.doublings == fixed);
        doubled.unwrap_or(usize::MAX).min(cap)
    }

    /// A pass ended, with the fixed window and the cap as they are now: tunes the window for
    /// the next one.
    pub fn pass_ended(&mut self, pass: Pass, fixed: usize, cap: usize) {
        if self.under != Some((fixed, cap)) {
            *self = Self { under: Some((fixed, cap)), ..Self::new() };
            return;
        }
        if let Some((from, before, settling)) = self.trial.take() {
            if settling {
                self.trial = Some((from, before, false));
                return;
            }
            if pass.seconds > before * (1.0 - GAIN) {
                self.doublings = from;
                self.hold = HOLD_PASSES;
                return;
            }
        }
        if self.hold > 0 {
            self.hold -= 1;
            return;
        }
        let deeper = Self { doublings: self.doublings + 1, ..self.clone() };
        if pass.waited > WAITING_SHARE * pass.seconds && deeper.window(fixed, cap) > self.window(fixed, cap) {
            self.trial = Some((self.doublings, pass.seconds, true));
            self.doublings += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: usize = 1 << 20;
    const FIXED: usize = 256 * MIB;

    fn pass(seconds: f64, waited: f64) -> Pass {
        Pass { seconds, waited }
    }

    #[test]
    fn a_loop_that_waits_less_with_a_deeper_window_keeps_it_and_climbs_to_the_cap() {
        let cap = 1024 * MIB;
        let mut t = WindowTuner::new();
        t.pass_ended(pass(1.0, 0.3), FIXED, cap); // the first pass under this budget: measured only
        assert_eq!(t.window(FIXED, cap), FIXED);
        t.pass_ended(pass(1.0, 0.3), FIXED, cap);
        assert_eq!(t.window(FIXED, cap), 512 * MIB, "waited 30%: a trial");
        t.pass_ended(pass(1.5, 0.1), FIXED, cap);
        assert_eq!(t.window(FIXED, cap), 512 * MIB, "the trial's first pass is not measured");
        t.pass_ended(pass(0.8, 0.1), FIXED, cap);
        assert_eq!(t.window(FIXED, cap), 1024 * MIB, "20% faster and still waiting: kept, and deeper");
        t.pass_ended(pass(0.7, 0.0), FIXED, cap);
        t.pass_ended(pass(0.7, 0.0), FIXED, cap);
        assert_eq!(t.window(FIXED, cap), 1024 * MIB, "at the cap");
        t.pass_ended(pass(0.7, 0.2), FIXED, cap);
        assert_eq!(t.window(FIXED, cap), 1024 * MIB, "nothing deeper to try");
    }

    #[test]
    fn a_loop_bound_by_the_link_goes_back_and_holds() {
        let cap = 1024 * MIB;
        let mut t = WindowTuner::new();
        t.pass_ended(pass(1.0, 0.5), FIXED, cap);
        t.pass_ended(pass(1.0, 0.5), FIXED, cap);
        assert_eq!(t.window(FIXED, cap), 512 * MIB);
        t.pass_ended(pass(0.5, 0.5), FIXED, cap);
        t.pass_ended(pass(1.05, 0.5), FIXED, cap);
        assert_eq!(t.window(FIXED, cap), FIXED, "slower with more traffic: back");
        for _ in 0..HOLD_PASSES {
            t.pass_ended(pass(1.0, 0.5), FIXED, cap);
            assert_eq!(t.window(FIXED, cap), FIXED, "held");
        }
        t.pass_ended(pass(1.0, 0.5), FIXED, cap);
        assert_eq!(t.window(FIXED, cap), 512 * MIB, "tried again after the hold");
    }

    #[test]
    fn a_new_budget_starts_over_from_the_fixed_window() {
        let mut t = WindowTuner::new();
        t.pass_ended(pass(1.0, 0.5), FIXED, 1024 * MIB);
        t.pass_ended(pass(1.0, 0.5), FIXED, 1024 * MIB);
        t.pass_ended(pass(0.9, 0.0), FIXED, 1024 * MIB);
        t.pass_ended(pass(0.5, 0.0), FIXED, 1024 * MIB);
        assert_eq!(t.window(FIXED, 1024 * MIB), 512 * MIB);
        t.pass_ended(pass(0.5, 0.0), FIXED, 4096 * MIB);
        assert_eq!(t.window(FIXED, 4096 * MIB), FIXED);
        // A small budget: the fixed window is its eighth, a trial doubles it to the cap.
        let (fixed, cap) = (64 * MIB, 128 * MIB);
        t.pass_ended(pass(1.0, 0.5), fixed, cap);
        assert_eq!(t.window(fixed, cap), fixed, "never more than the fixed window untried");
        t.pass_ended(pass(1.0, 0.5), fixed, cap);
        assert_eq!(t.window(fixed, cap), cap);
        assert_eq!(t.window(fixed, 32 * MIB), 32 * MIB, "never beyond the cap");
    }

    proptest! {
        /// Whatever the passes and budgets: the window is the fixed one doubled zero or more
        /// times, within the cap; it is the fixed one after any change of budget; and a trial's
        /// window is kept only after a pass faster by `GAIN` than the one before the trial.
        #[test]
        fn the_window_stays_within_its_bounds(
            fixed_mib in 1usize..512,
            passes in proptest::collection::vec((0.01f64..2.0, 0.0f64..1.0, 0usize..3), 1..200),
        ) {
            let fixed = fixed_mib * MIB;
            let caps = [fixed / 2, 4 * fixed, 64 * fixed];
            let mut t = WindowTuner::new();
            for (seconds, waited_share, c) in passes {
                let cap = caps[c];
                let before = t.clone();
                t.pass_ended(pass(seconds, seconds * waited_share), fixed, cap);
                let window = t.window(fixed, cap);
                prop_assert!(window <= cap);
                prop_assert!(window == cap || (window.is_multiple_of(fixed) && (window / fixed).is_power_of_two()));
                if before.under != Some((fixed, cap)) {
                    prop_assert_eq!(window, fixed.min(cap));
                }
                if let (Some((from, faster_than, false)), true) = (before.trial, before.under == Some((fixed, cap))) {
                    if t.doublings > from {
                        prop_assert!(seconds <= faster_than * (1.0 - GAIN));
                    }
                }
            }
        }
    }
}
