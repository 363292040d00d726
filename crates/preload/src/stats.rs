//! What the interposed program allocated where, for `tiermem run --stats` (`TIERMEM_STATS=1`):
//! counters kept by the process state (process.rs) under its lock, printed once at exit.

use tiermem::format_size;

/// Bytes now and at most, of one tier or kind.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Level {
    pub now: usize,
    pub peak: usize,
}

impl Level {
    const ZERO: Level = Level { now: 0, peak: 0 };

    fn add(&mut self, bytes: usize) {
        self.now += bytes;
        self.peak = self.peak.max(self.now);
    }

    fn sub(&mut self, bytes: usize) {
        self.now = self.now.saturating_sub(bytes);
    }
}

/// The process's counters. Bytes are whole chunks (allocations round up to them).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Allocations tiermem made (mapped), and of those how many had chunks on the host.
    pub allocations: u64,
    pub spilled_allocations: u64,
    /// Allocations refused (`CUDA_ERROR_OUT_OF_MEMORY`, or another failure logged).
    pub refused: u64,
    pub live: Level,
    pub hbm: Level,
    pub host: Level,
    /// `cuMemAllocManaged` bytes: passed through to the driver, counted only.
    pub managed: Level,
}

impl Stats {
    pub const fn new() -> Self {
        Stats {
            allocations: 0,
            spilled_allocations: 0,
            refused: 0,
            live: Level::ZERO,
            hbm: Level::ZERO,
            host: Level::ZERO,
            managed: Level::ZERO,
        }
    }

    pub fn allocated(&mut self, hbm: usize, host: usize) {
        self.allocations += 1;
        self.spilled_allocations += u64::from(host > 0);
        self.live.add(1);
        self.hbm.add(hbm);
        self.host.add(host);
    }

    pub fn freed(&mut self, hbm: usize, host: usize) {
        self.live.sub(1);
        self.hbm.sub(hbm);
        self.host.sub(host);
    }

    pub fn managed_allocated(&mut self, bytes: usize) {
        self.managed.add(bytes);
    }

    pub fn managed_freed(&mut self, bytes: usize) {
        self.managed.sub(bytes);
    }

    /// The lines `--stats` prints.
    pub fn report(&self) -> String {
        format!(
            "tiermem: stats: {} allocations ({} with chunks on the host, {} refused), {} live at exit, peak {}\n\
             tiermem: stats: HBM {} at exit, peak {}; host {} at exit, peak {}; managed (passed through) {} at exit, peak {}",
            self.allocations,
            self.spilled_allocations,
            self.refused,
            self.live.now,
            self.live.peak,
            format_size(self.hbm.now),
            format_size(self.hbm.peak),
            format_size(self.host.now),
            format_size(self.host.peak),
            format_size(self.managed.now),
            format_size(self.managed.peak),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peaks_stay_when_levels_fall() {
        let mut s = Stats::default();
        s.allocated(4 << 20, 0);
        s.allocated(2 << 20, 6 << 20);
        s.freed(2 << 20, 6 << 20);
        assert_eq!((s.allocations, s.spilled_allocations, s.live.now, s.live.peak), (2, 1, 1, 2));
        assert_eq!((s.hbm.now, s.hbm.peak, s.host.now, s.host.peak), (4 << 20, 6 << 20, 0, 6 << 20));
        let report = s.report();
        assert!(report.contains("2 allocations (1 with chunks on the host, 0 refused)"), "{report}");
        assert!(report.contains("HBM 4.00 MiB at exit, peak 6.00 MiB; host 0 B at exit, peak 6.00 MiB"), "{report}");
    }
}
