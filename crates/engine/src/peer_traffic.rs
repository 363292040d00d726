//! What each lender's traffic may be now: while a lender's own kernels run (the lender watch
//! reads NVML's utilisation every poll), the bytes the peer tier moves to and from its HBM
//! are held to `TIERMEM_PEER_BUSY_RATE` by a token bucket per lender (`policy::LinkBudget`,
//! which has the reasoning). Chunks leaving HBM go to a busy lender only while its bucket
//! holds them (else to the host tier), background cleaning waits for it, and reads of chunks
//! whose copy is there are charged to it. This is the clock and the buckets; the peer tier
//! asks them.

use std::time::{Duration, Instant};
use tiermem_policy::LinkBudget;

/// At or above this percent of kernel time a lender counts as busy.
pub(crate) const BUSY_PERCENT: u32 = 10;

pub(crate) struct LenderTraffic {
    start: Instant,
    /// By lender index; empty when nothing is held (`TIERMEM_PEER_BUSY_RATE=off`).
    budgets: Vec<LinkBudget>,
}

impl LenderTraffic {
    /// Buckets for `lenders` lenders, each filling at `rate` bytes per second while its lender
    /// is busy, holding at most 1/20 s of it (at least one `chunk`); `None`: nothing held.
    pub fn new(lenders: usize, rate: Option<usize>, chunk: usize) -> Self {
        let budgets = match rate {
            Some(rate) => {
                let burst = if rate == 0 { 0 } else { (rate / 20).max(chunk) };
                vec![LinkBudget::new(rate as u64, burst as u64); lenders]
            }
            None => Vec::new(),
        };
        Self { start: Instant::now(), budgets }
    }

    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// Lender `lender` runs work of its own now (`busy`) or not.
    pub fn set_busy(&mut self, lender: usize, busy: bool) {
        let now = self.now();
        if let Some(budget) = self.budgets.get_mut(lender) {
            budget.set_busy(now, busy);
        }
    }

    pub fn busy(&self, lender: usize) -> bool {
        self.budgets.get(lender).is_some_and(LinkBudget::busy)
    }

    /// Whether some lender's traffic is held now.
    pub fn any_busy(&self) -> bool {
        self.budgets.iter().any(LinkBudget::busy)
    }

    /// How many of `want` chunks of `chunk` bytes lender `lender` may take now.
    pub fn room(&mut self, lender: usize, chunk: usize, want: usize) -> usize {
        let now = self.now();
        self.budgets.get_mut(lender).map_or(want, |b| b.room(now).min((want * chunk) as u64) as usize / chunk)
    }

    /// Counts `bytes` moved to or from lender `lender`.
    pub fn charge(&mut self, lender: usize, bytes: usize) {
        let now = self.now();
        if let Some(budget) = self.budgets.get_mut(lender) {
            budget.charge(now, bytes as u64);
        }
    }
}
