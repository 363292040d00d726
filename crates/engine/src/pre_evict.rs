//! Pre-eviction (memHarvester §4.2.1): keep some HBM free ahead of demand, so that an acquire
//! of missing chunks finds room instead of waiting for evictions.
//!
//! After each acquire (calls.rs), if fewer than `TIERMEM_PRE_EVICT` worth of chunks are free
//! or already on their way down, the policy's next victims start down at once, without
//! waiting: their copies run while the program computes, and a later acquire reaps them. Only
//! moves that cost the next acquire nothing are made ([`cheap_victims`]): clean chunks (they
//! leave without a copy) and dirty ones for which the peer tier has a free slot already made —
//! a copy over NVLink. A dirty chunk bound for the host waits for demand: a copy to the host
//! in flight makes the next `cuMemMap` wait for it (movement.rs), the very stall pre-eviction
//! is meant to remove, and host slots may have to be found by spilling. A chunk evicted early
//! and wanted again is taken back before it has left (`cancel_leaving`) or comes back over
//! NVLink. Off by default until measured.

use crate::state::{ChunkRef, ChunkTable};

/// How many chunks to start down so that `keep` are free or leaving, `free` being so now;
/// `None` when enough are.
pub(crate) fn shortfall(keep: usize, free: usize) -> Option<usize> {
    keep.checked_sub(free).filter(|&n| n > 0)
}

/// Up to `short` of the policy's `victims` (in its order) whose leaving costs the next acquire
/// nothing: the clean ones, and as many dirty ones as the peer tier has free slots (`peer_room`).
pub(crate) fn cheap_victims(
    state: &ChunkTable,
    victims: Vec<ChunkRef>,
    mut peer_room: usize,
    short: usize,
) -> Vec<ChunkRef> {
    victims
        .into_iter()
        .filter(|&r| match state.chunk(r).is_clean() {
            true => true,
            false if peer_room > 0 => {
                peer_room -= 1;
                true
            }
            false => false,
        })
        .take(short)
        .collect()
}
