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

/// The process's counters. Bytes are what is mapped (allocations round up to 2 MiB granules).
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

    /// A chunk of `bytes` moved up to HBM (`up`) or down to the host (migrate.rs).
    pub fn moved(&mut self, bytes: usize, up: bool) {
        let (to, from) = if up { (&mut self.hbm, &mut self.host) } else { (&mut self.host, &mut self.hbm) };
        to.add(bytes);
        from.sub(bytes);
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

/// What migration did (migrate.rs's counters), and what launches showed (hotness.rs).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    pub enabled: bool,
    /// Chunks moved up to HBM, down to the host, and moves that failed (the chunk stayed).
    pub up: u64,
    pub down: u64,
    pub failed: u64,
    pub bytes: u64,
    /// Quiesce points where chunks moved, and those passed over (module docs of migrate.rs).
    pub taken: u64,
    pub skipped: u64,
    /// Pauses tiermem made because the program had not synchronized for a while (migrate.rs).
    pub unsynced_pauses: u64,
    /// Time spent at the quiesce points taken: waiting for the context, then moving.
    pub nanos: u64,
    /// Launches whose arguments were scanned (only while some chunk is on the host), those
    /// that passed pointers into tiermem's allocations, and those of which all were in HBM.
    pub launches_scanned: u64,
    pub launches_with_pointers: u64,
    pub launches_all_in_hbm: u64,
    /// Stage 3 (cycle.rs): whether it is on, pauses taken within cycles, time in them, chunks
    /// moved at them; cycles followed to their end, and those that diverged from the recording;
    /// time spent planning (at the synchronizations that end cycles).
    pub segments: bool,
    pub plan_nanos: u64,
    pub pauses: u64,
    pub pause_nanos: u64,
    pub pause_chunks: u64,
    pub cycles_followed: u64,
    pub cycles_diverged: u64,
    /// Where moving took its time (remap.rs's phases, in order): (nanoseconds, times counted).
    pub phases: [(u64, u64); PHASE_NAMES.len()],
}

/// The names of remap.rs's phases, in order, as `--stats` prints them.
pub const PHASE_NAMES: [&str; 8] = [
    "waiting for the GPU",
    "creating host chunks",
    "creating HBM chunks",
    "mapping shadows",
    "copying",
    "remapping",
    "opening",
    "releasing",
];

impl Migration {
    /// One line: milliseconds per phase (and the chunks created).
    fn phases_line(&self) -> String {
        let parts: Vec<String> = PHASE_NAMES
            .iter()
            .zip(self.phases)
            .map(|(name, (nanos, calls))| match name.starts_with("creating") {
                true => format!("{name} {:.1} ms ({calls})", nanos as f64 / 1e6),
                false => format!("{name} {:.1} ms", nanos as f64 / 1e6),
            })
            .collect();
        format!("tiermem: stats: moves: {}", parts.join(", "))
    }
}

impl Migration {
    /// The share of launches with tiermem's pointers whose pointers were all in HBM, if any.
    pub fn all_in_hbm_share(&self) -> Option<f64> {
        (self.launches_with_pointers > 0).then(|| self.launches_all_in_hbm as f64 / self.launches_with_pointers as f64)
    }

    /// The lines `--stats` prints.
    pub fn report(&self) -> String {
        let share = self.all_in_hbm_share().map_or("-".to_string(), |s| format!("{:.1}%", s * 100.0));
        format!(
            "tiermem: stats: migration {}: {} chunks up, {} down ({} moved), {} failed; {} quiesce points taken ({:.1} ms), {} skipped; {} pauses where the program had not synchronized\n\
             tiermem: stats: launches: {} scanned, {} with tiermem pointers, {share} of those all in HBM\n\
             tiermem: stats: segments {}: {} pauses ({:.1} ms), {} chunks moved at pauses; {} cycles followed to the end, {} diverged; {:.1} ms planning\n\
             {}",
            if self.enabled { "on" } else { "off" },
            self.up,
            self.down,
            format_size(self.bytes as usize),
            self.failed,
            self.taken,
            self.nanos as f64 / 1e6,
            self.skipped,
            self.unsynced_pauses,
            self.launches_scanned,
            self.launches_with_pointers,
            if self.segments { "on" } else { "off" },
            self.pauses,
            self.pause_nanos as f64 / 1e6,
            self.pause_chunks,
            self.cycles_followed,
            self.cycles_diverged,
            self.plan_nanos as f64 / 1e6,
            self.phases_line(),
        )
    }

    /// The counters as one JSON object (`TIERMEM_STATS_JSON`), with the allocation counters
    /// and the most bytes neighbours lent at once (spill.rs).
    pub fn json(&self, stats: &Stats, neighbours_peak_bytes: usize) -> String {
        let share = self.all_in_hbm_share().map_or("null".to_string(), |s| format!("{s:.6}"));
        format!(
            concat!(
                "{{\"allocations\": {}, \"refused\": {}, \"hbm_peak_bytes\": {}, \"host_peak_bytes\": {}, ",
                "\"neighbours_peak_bytes\": {}, ",
                "\"migration\": {{\"enabled\": {}, \"chunks_up\": {}, \"chunks_down\": {}, \"bytes_moved\": {}, ",
                "\"failed\": {}, \"quiesce_taken\": {}, \"quiesce_skipped\": {}, \"quiesce_ms\": {:.3}, \"unsynced_pauses\": {}}}, ",
                "\"segments\": {{\"enabled\": {}, \"pauses\": {}, \"pause_ms\": {:.3}, \"pause_chunks\": {}, ",
                "\"cycles_followed\": {}, \"cycles_diverged\": {}, \"plan_ms\": {:.3}}}, ",
                "\"move_phases_ms\": {{{}}}, ",
                "\"launches\": {{\"scanned\": {}, \"with_pointers\": {}, \"all_in_hbm\": {}, \"all_in_hbm_share\": {}}}}}"
            ),
            stats.allocations,
            stats.refused,
            stats.hbm.peak,
            stats.host.peak,
            neighbours_peak_bytes,
            self.enabled,
            self.up,
            self.down,
            self.bytes,
            self.failed,
            self.taken,
            self.skipped,
            self.nanos as f64 / 1e6,
            self.unsynced_pauses,
            self.segments,
            self.pauses,
            self.pause_nanos as f64 / 1e6,
            self.pause_chunks,
            self.cycles_followed,
            self.cycles_diverged,
            self.plan_nanos as f64 / 1e6,
            PHASE_NAMES
                .iter()
                .zip(self.phases)
                .map(|(name, (nanos, _))| format!("\"{name}\": {:.3}", nanos as f64 / 1e6))
                .collect::<Vec<_>>()
                .join(", "),
            self.launches_scanned,
            self.launches_with_pointers,
            self.launches_all_in_hbm,
            share,
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

    #[test]
    fn moves_shift_bytes_between_tiers_and_are_reported() {
        let mut s = Stats::default();
        s.allocated(2 << 20, 4 << 20);
        s.moved(2 << 20, true);
        assert_eq!((s.hbm.now, s.host.now), (4 << 20, 2 << 20));
        s.moved(2 << 20, false);
        assert_eq!((s.hbm.now, s.host.now), (2 << 20, 4 << 20));
        let m = Migration {
            enabled: true,
            up: 3,
            down: 1,
            bytes: 8 << 20,
            taken: 2,
            skipped: 5,
            unsynced_pauses: 1,
            nanos: 1_500_000,
            ..Migration::default()
        };
        let report = m.report();
        assert!(report.contains("migration on: 3 chunks up, 1 down (8.00 MiB moved), 0 failed; 2 quiesce points taken (1.5 ms), 5 skipped"), "{report}");
        assert!(report.contains("launches: 0 scanned, 0 with tiermem pointers, - of those"), "{report}");
        assert!(
            report.contains(
                "segments off: 0 pauses (0.0 ms), 0 chunks moved at pauses; 0 cycles followed to the end, 0 diverged"
            ),
            "{report}"
        );
        let json = m.json(&s, 0);
        assert!(json.contains("\"chunks_up\": 3") && json.contains("\"all_in_hbm_share\": null}}"), "{json}");
        assert!(json.contains("\"segments\": {\"enabled\": false, \"pauses\": 0, \"pause_ms\": 0.000"), "{json}");
        let mut phases = m;
        phases.phases[4] = (2_500_000, 3);
        phases.phases[1] = (700_000, 1);
        let report = phases.report();
        assert!(report.contains("moves: waiting for the GPU 0.0 ms, creating host chunks 0.7 ms (1),"), "{report}");
        assert!(report.contains("copying 2.5 ms, remapping 0.0 ms"), "{report}");
        let json = phases.json(&s, 0);
        assert!(
            json.contains("\"move_phases_ms\": {\"waiting for the GPU\": 0.000,")
                && json.contains("\"copying\": 2.500"),
            "{json}"
        );
        assert!(serde_json::from_str::<serde_json::Value>(&json).is_ok(), "{json}");
    }
}
