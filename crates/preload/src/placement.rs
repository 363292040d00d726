//! Where a new allocation's chunks go: pure logic, no driver, so that stage 2 (migration at
//! quiesce points) can replace it without touching the interposition.
//!
//! Stage 1 fills HBM first: an allocation's first chunks go to HBM while the budget has room,
//! the rest to host memory. Nothing moves afterwards, so an allocation made while HBM is full
//! stays on the host even after HBM frees up.

/// Whether an allocation of `size` bytes is left to the driver's own allocator, counted against
/// the budget: a small one (at most half the driver's granularity, 2 MiB) that fits in it. A
/// whole granule for a few KiB
/// would spend the budget 2 MiB at a time and cost a driver call of ~11 µs or more each, where
/// the driver packs small allocations together; a program of many small buffers that fits must
/// run as it does without tiermem. Such an allocation is HBM for good (the driver's memory
/// cannot be remapped), which costs little while it is small. One that does not fit takes
/// chunks as any other (on the host).
pub fn small_to_driver(size: usize, granularity: usize, budget: usize, hbm_used: usize) -> bool {
    size <= granularity / 2 && hbm_used.saturating_add(small_footprint(size)) <= budget
}

/// What a small allocation left to the driver counts against the budget: its size rounded up
/// to the driver's alignment of 512 B.
pub fn small_footprint(size: usize) -> usize {
    size.next_multiple_of(512)
}

/// Where one chunk lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    Hbm,
    Host,
}

/// How many chunks of one allocation go to each tier: the first `hbm` in HBM, then `host`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub hbm: usize,
    pub host: usize,
}

impl Placement {
    /// The tier of chunk `index` (counted from the allocation's start).
    pub fn tier(&self, index: usize) -> Tier {
        if index < self.hbm {
            Tier::Hbm
        } else {
            Tier::Host
        }
    }
}

/// Places an allocation of `bytes`, cut into chunks of `chunk_bytes` (the last one shorter),
/// with `hbm_used` of the `budget` (bytes) already taken by earlier allocations: its first
/// chunks in HBM as far as they fit.
pub fn place(bytes: usize, chunk_bytes: usize, budget: usize, hbm_used: usize) -> Placement {
    let chunk_bytes = chunk_bytes.max(1);
    let chunks = bytes.div_ceil(chunk_bytes);
    let room = budget.saturating_sub(hbm_used);
    // All of it, or the whole chunks that fit (then the last, short one does not).
    let hbm = if bytes <= room { chunks } else { room / chunk_bytes };
    Placement { hbm, host: chunks - hbm }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB2: usize = 2 << 20;

    #[test]
    fn fills_hbm_first_then_host() {
        assert_eq!(place(3 * MIB2, MIB2, 64 << 20, 0), Placement { hbm: 3, host: 0 });
        assert_eq!(place(50 * MIB2, MIB2, 64 << 20, 4 << 20), Placement { hbm: 30, host: 20 });
        assert_eq!(place(5 * MIB2, MIB2, 64 << 20, 64 << 20), Placement { hbm: 0, host: 5 });
    }

    #[test]
    fn the_last_chunk_is_short_and_placed_by_its_own_size() {
        const MIB32: usize = 32 << 20;
        assert_eq!(place(70 << 20, MIB32, 70 << 20, 0), Placement { hbm: 3, host: 0 }, "32 + 32 + 6 fit exactly");
        assert_eq!(place(70 << 20, MIB32, 69 << 20, 0), Placement { hbm: 2, host: 1 }, "the short one does not");
        assert_eq!(place(6 << 20, MIB32, 64 << 20, 0), Placement { hbm: 1, host: 0 }, "one short chunk");
        assert_eq!(place(70 << 20, MIB32, 40 << 20, 0), Placement { hbm: 1, host: 2 });
    }

    #[test]
    fn a_partial_chunk_of_room_is_no_room() {
        // 3 MiB left is one whole chunk; the second would cross the budget.
        assert_eq!(place(2 * MIB2, MIB2, 7 << 20, 4 << 20), Placement { hbm: 1, host: 1 });
    }

    #[test]
    fn usage_beyond_the_budget_places_on_host() {
        // The budget can be below what is used (it is read from the environment per process,
        // but HBM chunks fall back to the host when the GPU is full, not the other way round).
        assert_eq!(place(4 * MIB2, MIB2, 2 << 20, 8 << 20), Placement { hbm: 0, host: 4 });
        assert_eq!(place(4 * MIB2, MIB2, 0, 0).tier(0), Tier::Host);
    }

    #[test]
    fn small_allocations_that_fit_go_to_the_driver() {
        assert!(small_to_driver(4096, MIB2, 64 << 20, 0));
        assert!(small_to_driver(1 << 20, MIB2, 64 << 20, 0), "half a granule is small");
        assert!(!small_to_driver((1 << 20) + 1, MIB2, 64 << 20, 0), "more than half a granule takes chunks");
        assert!(small_to_driver(1000, MIB2, 1024, 0), "1000 B count as 1024");
        assert!(!small_to_driver(1000, MIB2, 1023, 0), "but not beyond the budget");
        assert!(!small_to_driver(1, MIB2, 64 << 20, 64 << 20), "a full budget sends even 1 B to chunks");
        assert_eq!(small_footprint(1), 512);
        assert_eq!(small_footprint(512), 512);
    }

    #[test]
    fn tier_follows_the_split() {
        let p = place(4 * MIB2, MIB2, 4 << 20, 0);
        let tiers: Vec<_> = (0..4).map(|i| p.tier(i)).collect();
        assert_eq!(tiers, [Tier::Hbm, Tier::Hbm, Tier::Host, Tier::Host]);
    }
}
