//! The FUSE server's request statistics: counts, bytes and latency histograms per kind of
//! request (read, write, discard), kept with relaxed atomics so that the I/O path takes no lock,
//! and reported as [`IoReport`] on the control socket.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

const LINEAR_US: usize = 128;
const BUCKETS: usize = LINEAR_US + 14;

/// Latencies in µs: one bucket per µs up to 128 µs, then one per power of two up to ~2 s.
struct Histogram([AtomicU64; BUCKETS]);

impl Histogram {
    fn new() -> Self {
        Histogram(std::array::from_fn(|_| AtomicU64::new(0)))
    }

    fn bucket(us: u64) -> usize {
        if us < LINEAR_US as u64 {
            us as usize
        } else {
            (LINEAR_US + (63 - us.leading_zeros() as usize) - 7).min(BUCKETS - 1)
        }
    }

    /// The upper bound, in µs, of bucket `i`.
    fn upper(i: usize) -> u64 {
        if i < LINEAR_US {
            i as u64 + 1
        } else {
            1 << (i - LINEAR_US + 8)
        }
    }

    fn record(&self, us: u64) {
        self.0[Self::bucket(us)].fetch_add(1, Ordering::Relaxed);
    }

    /// The latency below which `fraction` of the requests finished (the bucket's upper bound).
    fn quantile(&self, fraction: f64) -> Option<u64> {
        let counts: Vec<u64> = self.0.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let wanted = ((total as f64 * fraction).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, count) in counts.iter().enumerate() {
            seen += count;
            if seen >= wanted {
                return Some(Self::upper(i));
            }
        }
        Some(Self::upper(BUCKETS - 1))
    }
}

/// Counts of one kind of request.
pub(super) struct OpStats {
    count: AtomicU64,
    bytes: AtomicU64,
    nanos: AtomicU64,
    latency: Histogram,
}

impl OpStats {
    fn new() -> Self {
        OpStats {
            count: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            nanos: AtomicU64::new(0),
            latency: Histogram::new(),
        }
    }

    pub(super) fn record(&self, bytes: u64, started: Instant) {
        let nanos = started.elapsed().as_nanos() as u64;
        self.count.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.nanos.fetch_add(nanos, Ordering::Relaxed);
        self.latency.record(nanos / 1000);
    }

    fn report(&self) -> OpReport {
        let count = self.count.load(Ordering::Relaxed);
        let nanos = self.nanos.load(Ordering::Relaxed);
        OpReport {
            count,
            bytes: self.bytes.load(Ordering::Relaxed),
            mean_us: if count == 0 { None } else { Some(nanos as f64 / count as f64 / 1000.0) },
            p50_us: self.latency.quantile(0.5),
            p99_us: self.latency.quantile(0.99),
            p999_us: self.latency.quantile(0.999),
        }
    }
}

/// One kind of request as [`IoStats::report`] gives it: latencies are the server's, from the
/// request's arrival to its reply; percentiles are upper bounds of 1 µs buckets (below 128 µs).
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct OpReport {
    pub count: u64,
    pub bytes: u64,
    pub mean_us: Option<f64>,
    pub p50_us: Option<u64>,
    pub p99_us: Option<u64>,
    pub p999_us: Option<u64>,
}

/// The requests the server answered.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct IoReport {
    pub reads: OpReport,
    /// The same reads timed from arrival until the store had the bytes, before the reply:
    /// what `reads` adds to this is the reply's write to `/dev/fuse`, in which the kernel
    /// copies the bytes to the reader and completes its request.
    pub reads_in_store: OpReport,
    pub writes: OpReport,
    pub discards: OpReport,
    /// Requests answered with an error (the store's, or a request outside a file).
    pub errors: u64,
    /// Reads larger than the preallocated buffers, or arriving when all were taken: each
    /// allocated a buffer (none expected).
    pub buffer_allocations: u64,
}

/// The server's counters, shared with whoever reports them.
pub struct IoStats {
    pub(super) reads: OpStats,
    pub(super) reads_in_store: OpStats,
    pub(super) writes: OpStats,
    pub(super) discards: OpStats,
    pub(super) errors: AtomicU64,
    pub(super) buffer_allocations: AtomicU64,
}

impl IoStats {
    pub(super) fn new() -> Self {
        IoStats {
            reads: OpStats::new(),
            reads_in_store: OpStats::new(),
            writes: OpStats::new(),
            discards: OpStats::new(),
            errors: AtomicU64::new(0),
            buffer_allocations: AtomicU64::new(0),
        }
    }

    pub fn report(&self) -> IoReport {
        IoReport {
            reads: self.reads.report(),
            reads_in_store: self.reads_in_store.report(),
            writes: self.writes.report(),
            discards: self.discards.report(),
            errors: self.errors.load(Ordering::Relaxed),
            buffer_allocations: self.buffer_allocations.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_and_quantiles() {
        assert_eq!(Histogram::bucket(0), 0);
        assert_eq!(Histogram::bucket(127), 127);
        assert_eq!(Histogram::bucket(128), 128);
        assert_eq!(Histogram::upper(128), 256);
        assert_eq!(Histogram::bucket(255), 128);
        assert_eq!(Histogram::bucket(256), 129);
        assert_eq!(Histogram::bucket(u64::MAX), BUCKETS - 1);
        let h = Histogram::new();
        assert_eq!(h.quantile(0.5), None);
        for us in [10, 10, 10, 40, 1000] {
            h.record(us);
        }
        assert_eq!(h.quantile(0.5), Some(11));
        assert_eq!(h.quantile(0.8), Some(41));
        assert_eq!(h.quantile(0.99), Some(1024));
    }
}
