//! What `tiermem swap status` shows: the store's requests and areas (counted with atomics on
//! the request path, no lock), where the engine holds the bytes, the GPU as the monitor last
//! read it, and the give-backs so far.

use crate::limits::{Limits, Pressure, Reading};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use tiermem::format_size;

/// Request counters, updated on the request path. Thread safety: atomics, relaxed: a snapshot
/// may be a request behind.
#[derive(Default)]
pub(crate) struct Counters {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub discards: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub bytes_discarded: AtomicU64,
    pub errors: AtomicU64,
    pub pages_present: AtomicU64,
    pub areas_live: AtomicU64,
}

impl Counters {
    pub fn count(counter: &AtomicU64, bytes: &AtomicU64, len: u64) {
        counter.fetch_add(1, Relaxed);
        bytes.fetch_add(len, Relaxed);
    }

    pub fn requests(&self) -> Requests {
        Requests {
            reads: self.reads.load(Relaxed),
            writes: self.writes.load(Relaxed),
            discards: self.discards.load(Relaxed),
            bytes_read: self.bytes_read.load(Relaxed),
            bytes_written: self.bytes_written.load(Relaxed),
            bytes_discarded: self.bytes_discarded.load(Relaxed),
            errors: self.errors.load(Relaxed),
        }
    }
}

/// Requests served since open. `bytes_discarded` counts the bytes asked for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Requests {
    pub reads: u64,
    pub writes: u64,
    pub discards: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub bytes_discarded: u64,
    /// Requests that failed (the front end answered EIO or EINVAL).
    pub errors: u64,
}

/// One budget change that moved data out of HBM.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct GiveBack {
    /// HBM holding the store's data before and after.
    pub held_before: u64,
    pub held_after: u64,
    /// The budget it was asked to meet.
    pub budget: u64,
    /// From the budget change to the last copy down landing and its HBM going back to the driver.
    pub seconds: f64,
}

impl GiveBack {
    /// HBM given back, in bytes.
    pub fn bytes(&self) -> u64 {
        self.held_before.saturating_sub(self.held_after)
    }

    /// The give-back's speed (0 for one that moved nothing).
    pub fn bytes_per_second(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes() as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// All give-backs since open.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct GiveBacks {
    pub count: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub last: Option<GiveBack>,
}

impl GiveBacks {
    pub(crate) fn record(&mut self, event: GiveBack) {
        self.count += 1;
        self.bytes += event.bytes();
        self.seconds += event.seconds;
        self.last = Some(event);
    }
}

/// A snapshot of the store ([`crate::VramStore::stats`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StoreStats {
    pub size: u64,
    pub area_size: u64,
    pub areas: u64,
    /// Areas with an engine buffer (written, not wholly discarded).
    pub areas_live: u64,
    /// Pages present (written, not discarded), in bytes.
    pub bytes_present: u64,
    /// Where the engine holds the store's data, in bytes: HBM, the host staging tier, the file.
    pub hbm_bytes: u64,
    pub host_bytes: u64,
    pub file_bytes: u64,
    pub file_capacity: u64,
    /// The HBM budget in force.
    pub hbm_budget: u64,
    pub limits: Limits,
    pub external_cap: Option<u64>,
    /// The GPU as the monitor last read it, and the band it was in.
    pub gpu: Option<Reading>,
    pub pressure: Option<Pressure>,
    pub requests: Requests,
    pub give_backs: GiveBacks,
    /// The monitor's failed steps, and the last one's message.
    pub monitor_errors: u64,
    pub last_monitor_error: Option<String>,
}

impl std::fmt::Display for StoreStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let size = |bytes: u64| format_size(bytes as usize);
        writeln!(
            f,
            "device {}: {} present in {} of {} areas of {}",
            size(self.size),
            size(self.bytes_present),
            self.areas_live,
            self.areas,
            size(self.area_size)
        )?;
        writeln!(
            f,
            "held: HBM {} (budget {}), host staging {}, spill file {} of {}",
            size(self.hbm_bytes),
            size(self.hbm_budget),
            size(self.host_bytes),
            size(self.file_bytes),
            size(self.file_capacity)
        )?;
        if let (Some(gpu), Some(pressure)) = (self.gpu, self.pressure) {
            writeln!(f, "GPU: {} free of {}; {pressure}", size(gpu.free), size(gpu.total))?;
        }
        let cap = self.external_cap.map_or("none".to_string(), size);
        writeln!(
            f,
            "limits: soft {} free, hard {} free, grow margin {}, least budget {}; grant {cap}",
            size(self.limits.soft_free),
            size(self.limits.hard_free),
            size(self.limits.grow_margin),
            size(self.limits.min_budget)
        )?;
        let r = &self.requests;
        writeln!(
            f,
            "requests: {} reads ({}), {} writes ({}), {} discards ({}), {} errors",
            r.reads,
            size(r.bytes_read),
            r.writes,
            size(r.bytes_written),
            r.discards,
            size(r.bytes_discarded),
            r.errors
        )?;
        let g = &self.give_backs;
        write!(f, "give-backs: {} ({} in {:.3} s)", g.count, size(g.bytes), g.seconds)?;
        if let Some(last) = g.last {
            write!(f, "; last {} in {:.3} s", size(last.bytes()), last.seconds)?;
        }
        writeln!(f)?;
        if let Some(error) = &self.last_monitor_error {
            writeln!(f, "monitor: {} failed steps, last: {error}", self.monitor_errors)?;
        }
        Ok(())
    }
}
