//! Runs of free slots: what the tiers of chunk-sized slots (host_tier.rs, peer_tier.rs) hand
//! out when a page-out asks for several, so that adjacent chunks travel in one copy.

/// The first of `n` consecutive numbers among `free` (sorted) that lie in one slab of
/// `per_slab`: where a tier of slots (host_tier.rs, peer_tier.rs) can give a run that one copy
/// moves.
pub(crate) fn first_free_run(free: impl Iterator<Item = u32>, n: usize, per_slab: u32) -> Option<u32> {
    let (mut start, mut len) = (0u32, 0usize);
    for i in free {
        if len > 0 && i / per_slab == start / per_slab && i == start + len as u32 {
            len += 1;
        } else {
            (start, len) = (i, 1);
        }
        if len == n {
            return Some(start);
        }
    }
    None
}
