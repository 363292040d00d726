//! What the driver charges for a move, and stage 3's pauses skipped while it charges too much.
//!
//! A move's driver steps — unmapping the chunk's address, mapping the new chunk there, opening
//! it (`cuMemSetAccess`) — cost the H200 ~0.1–0.4 ms per 32 MiB alone, about as long as the
//! copy. While another process's kernels read host memory in place (another transparent
//! program over its budget, whose kernels read host chunks over PCIe), the same steps cost
//! 5–9 ms: the driver waits for that process's long kernels before it changes the GPU's page
//! tables (`scripts/gpu/probes/contended_remap.py`, BENCHMARKS.md, forty-first session). Stage
//! 3's plan assumes the alone price: on the H200 pair a training loop that pages ~1,000 chunks a
//! step at its pauses took 4–12 s a step beside such a neighbour, against 1.0 s at the same
//! budget alone.
//!
//! So every batch of moves is priced (driver time of those steps per MiB moved, batches of
//! [`MIN_BYTES`] or more); the cheapest price seen is the process's baseline. While the last
//! price is *dear* — over [`FACTOR`] times the baseline and over [`DEAR_NS_PER_MIB`] (three
//! times what copying the same bytes over PCIe takes, so that a baseline made of cheap moves,
//! HBM to a neighbour's HBM, does not make ordinary host moves look dear) — stage 3's pauses are
//! skipped: the chunks they would have brought up are read where they lie, over PCIe or NVLink
//! (slower, never wrong: every chunk stays mapped), and nothing is sent down that the plan
//! counted on. The moves made at the program's synchronizations go on (the first segment's, a
//! budget's shedding) and price the driver afresh; a cycle that made none lets its first pause
//! through as the probe. So pauses resume one cycle after the neighbour stops.
//!
//! `TIERMEM_SKIP_DEAR_PAUSES=off` keeps every pause. Pure except for the process-wide
//! [`Prices`] behind a mutex, which nothing else is taken under.

use std::sync::Mutex;

/// A batch smaller than this says little about the driver's price (two chunks of the smallest).
pub const MIN_BYTES: u64 = 4 << 20;
/// Dear: the last price over this many times the cheapest seen...
pub const FACTOR: f64 = 10.0;
/// ...and over this many nanoseconds per MiB (0.06 ms: three times a MiB's copy at ~50 GB/s).
pub const DEAR_NS_PER_MIB: f64 = 60_000.0;

/// The driver's prices seen, and the pauses skipped for them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prices {
    /// The cheapest price seen, ns per MiB.
    cheapest: Option<f64>,
    /// The last price seen.
    last: Option<f64>,
    /// The dearest price seen.
    dearest: Option<f64>,
    /// Whether a batch was priced since the last cycle ended.
    priced_this_cycle: bool,
    /// Pauses skipped while the price was dear.
    pub skipped: u64,
}

impl Default for Prices {
    fn default() -> Self {
        Self::new()
    }
}

impl Prices {
    pub const fn new() -> Prices {
        Prices { cheapest: None, last: None, dearest: None, priced_this_cycle: false, skipped: 0 }
    }

    /// A batch of moves of `bytes` whose driver steps took `nanos`.
    pub fn priced(&mut self, bytes: u64, nanos: u64) {
        if bytes < MIN_BYTES {
            return;
        }
        let price = nanos as f64 / (bytes as f64 / (1u64 << 20) as f64);
        self.cheapest = Some(self.cheapest.map_or(price, |c| c.min(price)));
        self.dearest = Some(self.dearest.map_or(price, |d| d.max(price)));
        self.last = Some(price);
        self.priced_this_cycle = true;
    }

    /// Whether the last price is dear (module docs).
    pub fn dear(&self) -> bool {
        match (self.cheapest, self.last) {
            (Some(cheapest), Some(last)) => last > FACTOR * cheapest && last > DEAR_NS_PER_MIB,
            _ => false,
        }
    }

    /// Whether stage 3's next pause should be skipped: the price is dear and this cycle has
    /// been priced already (otherwise the pause goes ahead, and prices the driver).
    pub fn skip_pause(&mut self) -> bool {
        if !self.dear() || !self.priced_this_cycle {
            return false;
        }
        self.skipped += 1;
        true
    }

    /// The program synchronized: a new cycle begins.
    pub fn cycle_ended(&mut self) {
        self.priced_this_cycle = false;
    }

    /// `--stats`' line, once a pause was skipped.
    pub fn report(&self) -> Option<String> {
        let per_32_mib = |ns: Option<f64>| ns.unwrap_or(0.0) * 32.0 / 1e6;
        (self.skipped > 0).then(|| {
            format!(
                "tiermem: stats: moves priced: the driver's steps cost {:.2} ms per 32 MiB at the cheapest, {:.2} at the dearest; \
                 {} pauses skipped while over {FACTOR}x the cheapest (their chunks read where they lay)",
                per_32_mib(self.cheapest),
                per_32_mib(self.dearest),
                self.skipped
            )
        })
    }
}

static PRICES: Mutex<Prices> = Mutex::new(Prices::new());

fn prices() -> std::sync::MutexGuard<'static, Prices> {
    // Every change under the lock is a few fields: consistent after a panic.
    PRICES.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| crate::boundary::switch("TIERMEM_SKIP_DEAR_PAUSES", true))
}

/// A batch of moves of `bytes` whose driver steps took `nanos` (migrate.rs).
pub fn priced(bytes: u64, nanos: u64) {
    prices().priced(bytes, nanos);
}

/// Whether stage 3's pause before this launch should be skipped (launch.rs).
pub fn skip_pause() -> bool {
    enabled() && prices().skip_pause()
}

/// The program synchronized (migrate.rs).
pub fn cycle_ended() {
    prices().cycle_ended();
}

/// `--stats`' line, if any pause was skipped.
pub fn report() -> Option<String> {
    prices().report()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch of 64 MiB priced at `ms` per 32 MiB.
    fn batch(p: &mut Prices, ms: f64) {
        p.priced(64 << 20, (2.0 * ms * 1e6) as u64);
    }

    #[test]
    fn pauses_go_on_at_the_alone_price_and_stop_beside_a_neighbour_reading_host_memory() {
        // The H200's prices (contended_remap.py): ~0.4 ms per 32 MiB alone, ~9 beside it.
        let mut p = Prices::new();
        batch(&mut p, 0.4);
        batch(&mut p, 0.5);
        assert!(!p.dear() && !p.skip_pause(), "the alone price varies: not dear");
        batch(&mut p, 9.0);
        assert!(p.dear() && p.skip_pause() && p.skip_pause(), "dear: this cycle's pauses are skipped");
        p.cycle_ended();
        assert!(!p.skip_pause(), "a cycle not yet priced lets its first pause through, to price it");
        batch(&mut p, 0.45);
        assert!(!p.dear() && !p.skip_pause(), "the neighbour left: pauses resume");
        assert_eq!(p.skipped, 2);
        assert!(p
            .report()
            .is_some_and(|line| line.contains("0.40 ms per 32 MiB at the cheapest, 9.00 at the dearest; 2 pauses")));
    }

    #[test]
    fn cheap_moves_between_gpus_do_not_make_host_moves_look_dear() {
        let mut p = Prices::new();
        batch(&mut p, 0.05); // HBM to a neighbour's HBM
        batch(&mut p, 0.9); // the host, alone, a slow moment: 18x, but 0.028 ms per MiB
        assert!(!p.dear(), "under the absolute floor");
        batch(&mut p, 5.0);
        assert!(p.dear());
    }

    #[test]
    fn small_batches_and_unpriced_processes_change_nothing() {
        let mut p = Prices::new();
        assert!(!p.dear() && !p.skip_pause() && p.report().is_none());
        p.priced(2 << 20, 100_000_000);
        assert!(!p.dear() && p.last.is_none(), "a batch under MIN_BYTES is not a price");
        batch(&mut p, 100.0);
        assert!(!p.dear(), "one price is its own baseline");
    }
}
