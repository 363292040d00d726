//! What the soak knows and counts: each buffer's contents as one seed per 64 KiB block, and
//! the tally of operations, kernels, mismatches and errors shared by the threads.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Bytes per block: the unit the soak writes and remembers.
pub const BLOCK: usize = 64 << 10;
/// A block's seed when it was never written: it reads as zeros.
pub const ZEROS: u64 = 0;
/// Set in a block's seed once the block was discarded (`Engine::discard`): until written it
/// reads as zeros or as what it held (the seed without this bit), a whole block either way.
/// Written patterns' seeds never have it ([`new_seed`]).
pub const DISCARDED: u64 = 1 << 63;
/// At most this many failures are kept for the report.
const KEPT_FAILURES: usize = 20;

/// The seed of every block of a buffer: block `b` holds `pattern::fill(seed, b * BLOCK, ..)`,
/// or zeros for [`ZEROS`].
pub type Contents = Vec<u64>;

/// Runs of equal seed in `blocks[first..end]`: `(first, end, seed)`.
pub fn runs(blocks: &[u64], first: usize, end: usize) -> Vec<(usize, usize, u64)> {
    let mut out: Vec<(usize, usize, u64)> = Vec::new();
    for (b, &seed) in blocks.iter().enumerate().take(end).skip(first) {
        match out.last_mut() {
            Some(run) if run.2 == seed && run.1 == b => run.1 = b + 1,
            _ => out.push((b, b + 1, seed)),
        }
    }
    out
}

/// The seed of a pattern about to be written.
pub fn new_seed(rng: &mut impl rand::Rng) -> u64 {
    rng.random_range(1..DISCARDED)
}

/// Where `bytes`, read from blocks `first..` of a buffer, differ from `blocks`: the first
/// differing byte offset in the buffer. A discarded block may hold zeros or what it held.
pub fn first_difference(blocks: &[u64], first: usize, bytes: &[u8]) -> Option<usize> {
    let end = first + bytes.len() / BLOCK;
    let differs = |seed: u64, offset: usize, part: &[u8]| match seed {
        ZEROS => part.iter().position(|&b| b != 0).map(|at| offset + at),
        seed => tiermem::mechanism::pattern::first_mismatch(seed, offset, part),
    };
    runs(blocks, first, end).into_iter().find_map(|(start, stop, seed)| {
        let part = &bytes[(start - first) * BLOCK..(stop - first) * BLOCK];
        match seed & DISCARDED {
            0 => differs(seed, start * BLOCK, part),
            _ => part.chunks(BLOCK).enumerate().find_map(|(k, block)| {
                let offset = (start + k) * BLOCK;
                differs(ZEROS, offset, block).and(differs(seed & !DISCARDED, offset, block))
            }),
        }
    })
}

/// The kinds of operation, for the per-kind counts of the report.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    KernelWrite,
    KernelCheck,
    HostWrite,
    HostRead,
    Prefetch,
    PageOut,
    PageOutStart,
    Finish,
    PageIn,
    Exchange,
    PageOutToFile,
    Reallocate,
    /// `step_enters` on one buffer: the known-schedule paths (recording, paging ahead, Belady).
    Step,
    PassBegins,
    /// `set_hbm_budget`, as the node daemon changes a tenant's, and `release_idle_hbm`.
    Budget,
    ReleaseIdle,
    /// `discard` of a random region of one of the thread's buffers.
    Discard,
}

impl Kind {
    const ALL: [Kind; 17] = [
        Kind::KernelWrite,
        Kind::KernelCheck,
        Kind::HostWrite,
        Kind::HostRead,
        Kind::Prefetch,
        Kind::PageOut,
        Kind::PageOutStart,
        Kind::Finish,
        Kind::PageIn,
        Kind::Exchange,
        Kind::PageOutToFile,
        Kind::Reallocate,
        Kind::Step,
        Kind::PassBegins,
        Kind::Budget,
        Kind::ReleaseIdle,
        Kind::Discard,
    ];

    fn name(self) -> &'static str {
        match self {
            Kind::KernelWrite => "kernel_write",
            Kind::KernelCheck => "kernel_check",
            Kind::HostWrite => "host_write",
            Kind::HostRead => "host_read",
            Kind::Prefetch => "prefetch",
            Kind::PageOut => "page_out",
            Kind::PageOutStart => "page_out_start",
            Kind::Finish => "finish",
            Kind::PageIn => "page_in",
            Kind::Exchange => "exchange",
            Kind::PageOutToFile => "page_out_to_file",
            Kind::Reallocate => "free_and_alloc",
            Kind::Step => "step_enters",
            Kind::PassBegins => "pass_begins",
            Kind::Budget => "set_hbm_budget",
            Kind::ReleaseIdle => "release_idle_hbm",
            Kind::Discard => "discard",
        }
    }
}

/// Counts shared by the soak's threads.
#[derive(Default)]
pub struct Tally {
    by_kind: [AtomicU64; Kind::ALL.len()],
    kernels: AtomicU64,
    mismatches: AtomicU64,
    unexpected: AtomicU64,
    pressure: AtomicU64,
    failures: Mutex<Vec<String>>,
}

/// The soak's result, as the JSON report's `metrics`.
#[derive(Debug, serde::Serialize)]
pub struct Summary {
    pub ops: u64,
    pub threads: usize,
    pub seconds: f64,
    pub gpu_kernel_ops: u64,
    pub file_tier_ops: u64,
    pub mismatches: u64,
    pub unexpected_errors: u64,
    pub leaked: usize,
    /// Operations refused for lack of memory under the soak's small caps: expected.
    pub out_of_memory: u64,
}

impl Summary {
    pub fn passed(&self) -> bool {
        self.ops > 0 && self.mismatches == 0 && self.unexpected_errors == 0 && self.leaked == 0
    }
}

impl Tally {
    pub fn op(&self, kind: Kind) {
        self.by_kind[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn kernels(&self, n: u64) {
        self.kernels.fetch_add(n, Ordering::Relaxed);
    }

    pub fn pressure(&self) {
        self.pressure.fetch_add(1, Ordering::Relaxed);
    }

    /// `words` words (or bytes, for host reads) differed from what was written.
    pub fn mismatch(&self, count: u64, what: String) {
        self.mismatches.fetch_add(count, Ordering::Relaxed);
        self.fail(format!("MISMATCH: {what}"));
    }

    pub fn unexpected(&self, what: String) {
        self.unexpected.fetch_add(1, Ordering::Relaxed);
        self.fail(format!("UNEXPECTED ERROR: {what}"));
    }

    fn fail(&self, what: String) {
        eprintln!("soak: {what}");
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if failures.len() < KEPT_FAILURES {
            failures.push(what);
        }
    }

    pub fn failures(&self) -> Vec<String> {
        self.failures.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn ops(&self) -> u64 {
        self.by_kind.iter().map(|n| n.load(Ordering::Relaxed)).sum()
    }

    pub fn by_kind(&self) -> serde_json::Value {
        let counts =
            Kind::ALL.iter().map(|&k| (k.name().to_string(), self.by_kind[k as usize].load(Ordering::Relaxed)));
        serde_json::Value::Object(counts.map(|(k, v)| (k, v.into())).collect())
    }

    /// One line of progress.
    pub fn progress(&self, seconds: f64) -> String {
        let ops = self.ops();
        format!(
            "{seconds:7.1} s  {ops:>10} ops ({:.0}/s)  {} kernels  {} out of memory  {} mismatches  {} unexpected errors",
            ops as f64 / seconds.max(1e-9),
            self.kernels.load(Ordering::Relaxed),
            self.pressure.load(Ordering::Relaxed),
            self.mismatches.load(Ordering::Relaxed),
            self.unexpected.load(Ordering::Relaxed)
        )
    }

    pub fn summary(&self, seconds: f64, threads: usize, file_tier_ops: u64, leaked: usize) -> Summary {
        Summary {
            ops: self.ops(),
            threads,
            seconds,
            gpu_kernel_ops: self.kernels.load(Ordering::Relaxed),
            file_tier_ops,
            mismatches: self.mismatches.load(Ordering::Relaxed),
            unexpected_errors: self.unexpected.load(Ordering::Relaxed),
            leaked,
            out_of_memory: self.pressure.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_group_equal_seeds() {
        assert_eq!(runs(&[5, 5, 0, 7, 7, 7], 1, 6), vec![(1, 2, 5), (2, 3, 0), (3, 6, 7)]);
        assert!(runs(&[1, 2], 1, 1).is_empty());
    }

    #[test]
    fn differences_are_found_in_patterns_and_zeros() {
        let blocks = [9, ZEROS];
        let mut bytes = vec![0u8; 2 * BLOCK];
        tiermem::mechanism::pattern::fill(9, 0, &mut bytes[..BLOCK]);
        assert_eq!(first_difference(&blocks, 0, &bytes), None);
        bytes[BLOCK + 3] = 1;
        assert_eq!(first_difference(&blocks, 0, &bytes), Some(BLOCK + 3));
    }

    #[test]
    fn a_discarded_block_holds_zeros_or_what_it_held_whole() {
        let blocks = [9 | DISCARDED; 2];
        let mut bytes = vec![0u8; 2 * BLOCK];
        tiermem::mechanism::pattern::fill(9, 0, &mut bytes[..BLOCK]);
        assert_eq!(first_difference(&blocks, 0, &bytes), None, "one block as it was, one zeros");
        bytes[BLOCK + 8] = 1;
        assert_eq!(first_difference(&blocks, 0, &bytes), Some(BLOCK), "neither: the pattern's first word differs");
        tiermem::mechanism::pattern::fill(9, 0, &mut bytes[..BLOCK]);
        bytes[..8].fill(0);
        assert!(first_difference(&blocks, 0, &bytes).is_some(), "half zeros, half the pattern");
        assert_eq!(first_difference(&[DISCARDED], 0, &vec![0u8; BLOCK]), None, "never written: zeros");
    }
}
