//! How much traffic a busy lender takes (memHarvester §6.2.1 left "throttling the harvesting
//! traffic" to future work; tiermem does it).
//!
//! Every byte the peer tier moves to or from a lender's HBM is served by that GPU's memory,
//! beside its own program's work: on the H100 pair, a borrower paging without pause slowed an
//! HBM-bound job on the lender by 17%. While the lender's own kernels run, the bytes moved to
//! and from it are held to a *rate*: a token bucket that fills at `rate` bytes per second up
//! to `burst`. New work that can go elsewhere (a chunk leaving HBM: the host tier takes it; a
//! background clean: it waits) asks first ([`LinkBudget::admits`]) and goes to the lender only
//! if the bucket holds its bytes; work that cannot (reading back a chunk whose only copy is
//! there) is charged anyway ([`LinkBudget::charge`]), leaving the bucket in debt, which the
//! asking work then waits out. Whenever bytes are admitted, all that moved while the lender
//! was busy fits in `burst` plus `rate` times the time elapsed. While the lender is idle
//! nothing is held.
//!
//! Pure and deterministic: time is an argument.

use std::time::Duration;

/// The bytes one lender may still take now, while it is busy.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkBudget {
    /// Bytes per second while busy.
    rate: f64,
    /// The most the bucket holds: what may pass at once after a pause.
    burst: f64,
    /// Bytes that may pass now; negative while in debt.
    tokens: f64,
    /// When `tokens` was last brought up to date.
    at: Duration,
    busy: bool,
}

impl LinkBudget {
    /// A budget of `rate` bytes per second, at most `burst` at once, starting full and idle.
    pub fn new(rate: u64, burst: u64) -> Self {
        Self { rate: rate as f64, burst: burst as f64, tokens: burst as f64, at: Duration::ZERO, busy: false }
    }

    /// Whether the lender's own work runs now: only then is its traffic held.
    pub fn set_busy(&mut self, now: Duration, busy: bool) {
        self.refill(now);
        self.busy = busy;
    }

    pub fn busy(&self) -> bool {
        self.busy
    }

    /// Bytes that may go to or come from the lender now, without debt (`u64::MAX` while it
    /// is idle).
    pub fn room(&mut self, now: Duration) -> u64 {
        self.refill(now);
        match self.busy {
            false => u64::MAX,
            true => self.tokens.max(0.0) as u64,
        }
    }

    /// Whether `bytes` more may go to or come from the lender now; if so they are counted.
    pub fn admits(&mut self, now: Duration, bytes: u64) -> bool {
        if self.room(now) < bytes {
            return false;
        }
        self.charge(now, bytes);
        true
    }

    /// Counts `bytes` that had to move (the bucket may go into debt).
    pub fn charge(&mut self, now: Duration, bytes: u64) {
        self.refill(now);
        if self.busy {
            self.tokens -= bytes as f64;
        }
    }

    fn refill(&mut self, now: Duration) {
        let elapsed = now.saturating_sub(self.at).as_secs_f64();
        self.at = self.at.max(now);
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn an_idle_lender_takes_everything_and_a_busy_one_its_rate() {
        let mut budget = LinkBudget::new(1_000_000, 100_000);
        assert!(budget.admits(MS, 10_000_000), "idle: nothing is held");
        budget.set_busy(MS, true);
        assert!(budget.admits(MS, 100_000), "the burst passes at once");
        assert!(!budget.admits(MS, 1), "then nothing until it refills");
        assert!(budget.admits(MS * 11, 10_000), "10 ms at 1 MB/s");
        assert!(!budget.admits(MS * 11, 1));
        budget.charge(MS * 11, 50_000);
        assert!(!budget.admits(MS * 60, 1_000), "a charge is debt to wait out");
        assert!(budget.admits(MS * 62, 1_000));
        budget.set_busy(MS * 62, false);
        assert!(budget.admits(MS * 62, u64::MAX), "idle again");
    }

    #[test]
    fn a_rate_of_zero_holds_all_new_traffic_of_a_busy_lender() {
        let mut budget = LinkBudget::new(0, 0);
        budget.set_busy(Duration::ZERO, true);
        assert!(!budget.admits(Duration::from_secs(1000), 1));
        assert!(budget.admits(Duration::ZERO, 0), "nothing is always admitted");
    }

    proptest! {
        /// While a lender is busy, whenever bytes are admitted, everything that moved so far
        /// (admitted or charged) fits in the burst plus the rate times the time elapsed,
        /// whatever was asked and charged, in whatever order. (Nothing is always admitted,
        /// in debt too: it moves nothing.)
        #[test]
        fn admitted_bytes_never_exceed_burst_plus_rate(
            rate in 0u64..10_000_000,
            burst in 0u64..1_000_000,
            calls in proptest::collection::vec((0u64..5_000, 0u64..2_000_000, any::<bool>()), 1..60),
        ) {
            let mut budget = LinkBudget::new(rate, burst);
            budget.set_busy(Duration::ZERO, true);
            let (mut now, mut moved) = (Duration::ZERO, 0f64);
            for (step_us, bytes, forced) in calls {
                now += Duration::from_micros(step_us);
                if forced {
                    budget.charge(now, bytes);
                    moved += bytes as f64;
                } else if budget.admits(now, bytes) && bytes > 0 {
                    moved += bytes as f64;
                    let ceiling = burst as f64 + rate as f64 * now.as_secs_f64();
                    prop_assert!(moved <= ceiling + 1.0, "moved {moved}, ceiling {ceiling}");
                }
            }
        }
    }
}
