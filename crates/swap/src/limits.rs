//! How much HBM the swap device may hold: GAME's soft and hard limits, the node daemon's grant,
//! and give-back, as one pure function ([`hbm_budget`]) of what the GPU reports.
//!
//! # The problem
//!
//! The device borrows VRAM that GPU work is not using. GPU work comes first: when a job starts
//! and allocates, the device must stop growing and, if the job needs more, give memory back —
//! without losing a byte and without ever stopping to serve the kernel (it moves areas to the
//! file tier below, which the engine does). When the job ends, the device grows back.
//!
//! # The thresholds, in free VRAM
//!
//! GAME states its limits as levels of GPU memory use. Here both are **bytes of free VRAM
//! left to others** (what `cuMemGetInfo` reports free), because that is what a job about to
//! start needs, whatever the GPU's size:
//!
//! * `free < hard_free` (**hard**): give back until `soft_free` is free again — the budget
//!   drops below what the store holds by the shortfall against `soft_free`, so the engine sends
//!   that much down at once. Shrinking to the soft level, not just to the hard one, is the
//!   first half of the hysteresis: after a give-back the GPU sits in the middle of the band
//!   that asks for nothing.
//! * `hard_free <= free < soft_free` (**soft**): keep what is held, take no more. The budget
//!   becomes what the store holds; a write to a new area then evicts the coldest area to the
//!   tiers below instead of taking another chunk.
//! * `soft_free <= free < soft_free + grow_margin` (**steady**): the budget may fall (it never
//!   exceeds what leaves `soft_free` free), but does not rise.
//! * `free >= soft_free + grow_margin` (**idle**): grow: the budget is what the store holds plus
//!   all free memory above `soft_free`. The margin is the second half of the hysteresis: a GPU
//!   whose free memory wobbles around `soft_free` does not make the budget follow it.
//!
//! Then the budget is capped by the node daemon's grant (`external_cap`) and by the GPU's size,
//! rounded down to whole chunks, and raised to `min_budget`: the engine copies every request
//! through HBM (a chunk in the file tier is paged in to be read), so a device with no HBM at all
//! could not serve; `min_budget` is that working set (default 32 MiB, 16 chunks: one per
//! request in flight). A grant below it is raised to it.
//!
//! # What "held" means
//!
//! `held` is the HBM holding the store's data (the engine's chunks in use). The monitor hands
//! the engine's idle chunks back to the driver before each reading (monitor.rs), so `held` is
//! all the store takes from the GPU, and `total - free - held` is what everyone else uses.
//!
//! # Properties (tests/store_limits.rs)
//!
//! The budget never exceeds the grant (or `min_budget`, if larger); never rises unless free
//! memory is past the margin; drops below what is held under hard pressure; is monotone in free
//! memory; and is a fixed point: the same reading with the budget it gave yields that budget
//! again, so a constant GPU sees no oscillation — also in closed loop, where what is held
//! follows the budget.

/// The limits, in bytes. Thread safety: plain data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Limits {
    /// Free VRAM below which the store takes no more, and which a give-back restores.
    pub soft_free: u64,
    /// Free VRAM below which the store gives HBM back. At most `soft_free`.
    pub hard_free: u64,
    /// The budget grows only while more than `soft_free + grow_margin` is free.
    pub grow_margin: u64,
    /// The least budget, whatever the GPU or the grant says: the engine's working set for
    /// requests in flight. Rounded up to whole chunks.
    pub min_budget: u64,
}

impl Default for Limits {
    /// Leave 4 GiB free for others, give back below 2 GiB, grow past 5 GiB; at least 32 MiB.
    fn default() -> Self {
        Self { soft_free: 4 << 30, hard_free: 2 << 30, grow_margin: 1 << 30, min_budget: 32 << 20 }
    }
}

impl Limits {
    /// Why these limits cannot work, if they cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.hard_free > self.soft_free {
            return Err(format!(
                "the hard limit ({} bytes free) must not exceed the soft limit ({} bytes free): give back only after taking no more",
                self.hard_free, self.soft_free
            ));
        }
        if self.min_budget == 0 {
            return Err("min_budget must be at least one chunk: every request is copied through HBM".into());
        }
        Ok(())
    }

    /// `min_budget` in whole chunks of `chunk` bytes (at least one).
    pub fn min_chunks(&self, chunk: u64) -> u64 {
        self.min_budget.div_ceil(chunk).max(1)
    }
}

/// What the monitor read from the GPU, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Reading {
    pub total: u64,
    pub free: u64,
    /// HBM holding the store's data.
    pub held: u64,
}

/// Which band free memory is in (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Pressure {
    /// Free memory past `soft_free + grow_margin`: the budget grows.
    Idle,
    /// Between `soft_free` and the margin: the budget does not rise.
    Steady,
    /// Below `soft_free`: take no more.
    Soft,
    /// Below `hard_free`: give back.
    Hard,
}

impl std::fmt::Display for Pressure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Pressure::Idle => "idle (growing)",
            Pressure::Steady => "steady",
            Pressure::Soft => "soft limit (taking no more)",
            Pressure::Hard => "hard limit (giving back)",
        })
    }
}

/// The budget the store should run with, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Decision {
    /// Bytes, a multiple of the chunk.
    pub budget: u64,
    pub pressure: Pressure,
}

/// The HBM budget for `reading`, given the budget now in force (`current`), the node daemon's
/// grant and the chunk size. Pure; see the module docs for the rules.
pub fn hbm_budget(limits: &Limits, external_cap: Option<u64>, chunk: u64, reading: Reading, current: u64) -> Decision {
    let Reading { total, free, held } = reading;
    let soft = limits.soft_free;
    let (pressure, wanted) = if free < limits.hard_free {
        (Pressure::Hard, current.min(held.saturating_sub(soft - free)))
    } else if free < soft {
        (Pressure::Soft, current.min(held))
    } else if free < soft.saturating_add(limits.grow_margin) {
        (Pressure::Steady, current.min(held.saturating_add(free - soft)))
    } else {
        (Pressure::Idle, held.saturating_add(free - soft))
    };
    let capped = external_cap.map_or(wanted, |cap| wanted.min(cap)).min(total);
    let floor = limits.min_chunks(chunk) * chunk;
    Decision { budget: (capped / chunk * chunk).max(floor), pressure }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const CHUNK: u64 = 2 << 20;

    fn decide(free: u64, held: u64, current: u64) -> Decision {
        hbm_budget(&Limits::default(), None, CHUNK, Reading { total: 80 * GIB, free, held }, current)
    }

    #[test]
    fn each_band_does_what_its_name_says() {
        // Idle: all free memory above the soft level.
        assert_eq!(decide(20 * GIB, 10 * GIB, 12 * GIB), Decision { budget: 26 * GIB, pressure: Pressure::Idle });
        // Steady: may fall, never rises.
        assert_eq!(decide(4 * GIB + GIB / 2, 10 * GIB, 10 * GIB).budget, 10 * GIB);
        assert_eq!(decide(4 * GIB + GIB / 2, 10 * GIB, 20 * GIB).budget, 10 * GIB + GIB / 2);
        // Soft: exactly what is held.
        assert_eq!(decide(3 * GIB, 10 * GIB, 20 * GIB), Decision { budget: 10 * GIB, pressure: Pressure::Soft });
        // Hard: give back the shortfall against the soft level.
        assert_eq!(decide(GIB, 10 * GIB, 10 * GIB), Decision { budget: 7 * GIB, pressure: Pressure::Hard });
        // Never below the floor, even with nothing free.
        assert_eq!(decide(0, GIB, 10 * GIB), Decision { budget: 32 << 20, pressure: Pressure::Hard });
    }

    #[test]
    fn the_grant_caps_the_budget_but_not_below_the_floor() {
        let reading = Reading { total: 80 * GIB, free: 70 * GIB, held: 0 };
        let limits = Limits::default();
        assert_eq!(hbm_budget(&limits, Some(3 * GIB + 1), CHUNK, reading, 0).budget, 3 * GIB);
        assert_eq!(hbm_budget(&limits, Some(0), CHUNK, reading, 0).budget, 32 << 20);
    }

    #[test]
    fn limits_that_cannot_work_are_refused() {
        let inverted = Limits { soft_free: GIB, hard_free: 2 * GIB, ..Limits::default() };
        assert!(inverted.check().unwrap_err().contains("must not exceed the soft limit"));
        assert!(Limits { min_budget: 0, ..Limits::default() }.check().is_err());
        assert_eq!(Limits { min_budget: 1, ..Limits::default() }.min_chunks(CHUNK), 1);
    }
}
