//! Keeping borrowed HBM removable (memHarvester §4.2): chunks whose only copy is in a
//! neighbour's HBM are copied to free host slots in the background, so that a lender taking
//! its memory back needs no copy — an unmap — and a borrower that does not answer in time
//! loses nothing.
//!
//! The lender watch (every poll) copies a batch of such chunks, at most
//! [`CLEAN_BATCH`] a poll: peer-located, not in HBM, with no host or file copy, not acquired
//! in place. Only free host room is used: cleaning never evicts, spills or waits for slots,
//! and the host copies it makes are spares, which the host tier takes back first when it
//! needs room (`Tiers::reclaim_host_copies`). It waits for its copy (a batch: ~1 ms) with
//! the lock held, like a reclaim. A chunk whose bytes change later comes into HBM first,
//! which gives up every copy below (`drop_copies`): a host copy made here is never stale.
//!
//! Giving borrowed HBM back (`reclaim_peer`, when a lender asks or its free memory falls below
//! the reserve) is here too: the lender watch calls both every poll.

use crate::engine::Inner;
use crate::error::Context;
use crate::fence::Fence;
use crate::state::{Below, ChunkRef};
use crate::sync::Arc;
use crate::Result;

/// The most chunks cleaned per poll of the lender watch (32 MiB).
pub const CLEAN_BATCH: usize = 16;

impl Inner {
    /// Copies up to `most` chunks whose only copy is in the peer tier to free host slots.
    /// Returns how many are clean now.
    pub(crate) fn clean_borrowed(&mut self, most: usize) -> Result<usize> {
        let call = "clean_borrowed";
        let peer = &mut self.tiers.peer;
        let dirty: Vec<ChunkRef> = self
            .state
            .chunks()
            .filter_map(|(r, c)| {
                let slot = c.peer().filter(|&slot| !peer.is_draining(slot))?;
                let only_copy = c.phys().is_none() && c.host().is_none() && c.file().is_none() && c.pins() == 0;
                // A busy lender's traffic budget last (peer_traffic.rs): cleaning can wait.
                (only_copy && peer.may_read(slot)).then_some(r)
            })
            .take(most)
            .collect();
        let mut want = dirty.len();
        let slots = loop {
            if want == 0 {
                return Ok(0);
            }
            if let Some(slots) = self.tiers.host.alloc(self.tiers.device.as_ref(), want).during(call)? {
                break slots;
            }
            want /= 2;
        };
        let refs = &dirty[..slots.len()];
        let fence = match self.tiers.copy_peer_to_host(&self.state, call, refs, &slots) {
            Ok(fence) => fence,
            Err(e) => {
                slots.into_iter().for_each(|s| self.tiers.host.free(s));
                return Err(e);
            }
        };
        if let Err(e) = self.wait_here(call, vec![fence]) {
            // No copy may land in slots given to someone else.
            let _ = self.tiers.device.synchronize_stream(self.tiers.streams.down);
            slots.into_iter().for_each(|s| self.tiers.host.free(s));
            return Err(e);
        }
        for (&r, &slot) in refs.iter().zip(&slots) {
            self.state.add_host_copy(r, slot);
        }
        self.tiers.counters.cleaned += refs.len() as u64;
        Ok(refs.len())
    }

    /// Gives the peer tier's draining slabs back to their lenders (peer_tier.rs): chunks whose
    /// only copy is in one are copied to host slots (spilling the host tier to the file if it
    /// must), other copies there are dropped, and the emptied slabs are released. Returns the
    /// bytes given back. Waits under the lock: a lender asking for its memory comes first. A slab
    /// holding a chunk acquired in place (in_place.rs) goes back at a later call, once it is
    /// released (the lender watch calls this every tick).
    pub(crate) fn reclaim_peer(&mut self, call: &'static str) -> Result<usize> {
        if !self.tiers.peer.draining() {
            return Ok(0);
        }
        let draining = |tiers: &crate::tiers::Tiers, chunk: &crate::state::Chunk| {
            chunk.peer().is_some_and(|slot| tiers.peer.is_draining(slot))
        };
        // Chunks still leaving HBM with a copy there: let them land first.
        let landing: Vec<Arc<Fence>> = self
            .state
            .chunks()
            .filter(|(_, c)| draining(&self.tiers, c))
            .filter_map(|(_, c)| c.leaving().cloned())
            .collect();
        self.wait_here(call, landing)?;
        self.tiers.reap(&mut self.state)?;
        let mut only_copies = Vec::new();
        let refs: Vec<ChunkRef> =
            self.state.chunks().filter(|(_, c)| draining(&self.tiers, c)).map(|(r, _)| r).collect();
        for r in refs {
            let chunk = self.state.chunk(r);
            if chunk.pinned_in_place() {
                // Read where it lies until released: its slab goes back at a later reclaim.
                continue;
            }
            if chunk.maps_in_place() {
                // Mapped at its slot in place: undone before the slot goes.
                self.tiers.unmap_below(&mut self.state, r).during(call)?;
            }
            let chunk = self.state.chunk(r);
            if chunk.phys().is_some() {
                let reader = chunk.ready().cloned();
                let slot = self.state.drop_peer_copy(r).expect("a peer copy");
                self.tiers.retire(Below::Peer(slot), reader);
            } else if chunk.host().is_some() || chunk.file().is_some() {
                let slot = self.state.drop_peer_copy(r).expect("a peer copy");
                self.tiers.peer.free(slot);
            } else {
                only_copies.push(r);
            }
        }
        for group in only_copies.chunks(self.tiers.host.cap().max(1)) {
            let slots = self.host_slots(call, group)?;
            let fence = match self.tiers.copy_peer_to_host(&self.state, call, group, &slots) {
                Ok(fence) => fence,
                Err(e) => {
                    slots.into_iter().for_each(|s| self.tiers.host.free(s));
                    return Err(e);
                }
            };
            self.wait_here(call, vec![fence])?;
            for (&r, &slot) in group.iter().zip(&slots) {
                self.state.add_host_copy(r, slot);
                let peer = self.state.drop_peer_copy(r).expect("a peer copy");
                self.tiers.peer.free(peer);
            }
        }
        // Copies up still reading dropped peer slots hold them until they are done.
        while self.tiers.peer.draining_in_use() {
            let Some(fence) = self.tiers.in_flight.next_retired().cloned() else { break };
            self.wait_here(call, vec![fence])?;
            self.tiers.reap(&mut self.state)?;
        }
        self.tiers.peer.release_drained(self.tiers.device.as_ref()).during(call)
    }

    /// Waits for `fences` with the lock held (the calls that may not retry).
    pub(crate) fn wait_here(&mut self, call: &'static str, fences: Vec<Arc<Fence>>) -> Result<()> {
        let unlocked = std::mem::replace(&mut self.wait_unlocked, false);
        let waited = self.wait_for(call, fences);
        self.wait_unlocked = unlocked;
        waited
    }
}
