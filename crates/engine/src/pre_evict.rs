//! Pre-eviction (memHarvester §4.2.1): keep some HBM free ahead of demand, so that an acquire
//! of missing chunks finds room instead of waiting for evictions.
//!
//! After each acquire, if fewer than `TIERMEM_PRE_EVICT` worth of chunks are free or already
//! on their way down, the policy's next victims start down at once, without waiting: their
//! copies run while the program computes, and a later acquire reaps them. Only moves that
//! cost the next acquire nothing are made: clean chunks (they leave without a copy) and dirty
//! ones for which the peer tier has a free slot already made — a copy over NVLink. A dirty
//! chunk bound for the host waits for demand: a copy to the host in flight makes the next
//! `cuMemMap` wait for it (movement.rs), the very stall pre-eviction is meant to remove, and
//! host slots may have to be found by spilling. A chunk evicted early and wanted again is
//! taken back before it has left (`cancel_leaving`) or comes back over NVLink. Off by default
//! until measured.

use crate::engine::Inner;
use crate::placement::Among;
use crate::state::ChunkRef;

impl Inner {
    /// Starts the chunks down that keep `pre_evict_chunks` free (see above). Best effort.
    pub(crate) fn pre_evict(&mut self) {
        let keep = self.pre_evict_chunks;
        if keep == 0 || self.tiers.reap(&mut self.state).is_err() {
            return;
        }
        let free = self.tiers.pool.available() + self.tiers.in_flight.chunks_moving_down();
        let Some(short) = keep.checked_sub(free).filter(|&n| n > 0) else { return };
        let Ok(victims) = self.victims(Among::Resident, "pre-evict", 2 * short, &[], None) else { return };
        let mut peer_room = self.tiers.peer.free_slots();
        let chosen: Vec<ChunkRef> = victims
            .into_iter()
            .filter(|&r| match self.state.chunk(r).is_clean() {
                true => true,
                false if peer_room > 0 => {
                    peer_room -= 1;
                    true
                }
                false => false,
            })
            .take(short)
            .collect();
        if !chosen.is_empty() {
            let _ = self.send_victims_down("pre-evict", &chosen);
        }
    }
}
