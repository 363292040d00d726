//! Giving a lender's memory back: what each neighbour lends follows its free memory
//! (`watch_lenders`), the node daemon's grants (`set_peer_lending`), and a reclaim drains the
//! slabs no longer lent (`reclaim_peer`), moving their chunks home or down first.

use crate::engine::Inner;
use crate::error::Context;
use crate::fence::Fence;
use crate::state::{Below, ChunkRef};
use crate::sync::Arc;
use crate::{Error, Result};

impl Inner {
    /// Reads each lender's free memory and sets what it lends (`lenders::recap`), giving back
    /// at once what it no longer lends, and whether its own work keeps it busy (its traffic is
    /// held then: peer_traffic.rs). Returns the bytes given back.
    pub(crate) fn watch_lenders(&mut self, reserve: usize) -> Result<usize> {
        let device = Arc::clone(&self.tiers.device);
        for lender in self.tiers.peer.lenders().to_vec() {
            // A lender whose memory cannot be read now keeps what it lends.
            let Ok(memory) = device.gpu_memory(lender.gpu) else { continue };
            let borrowed = self.tiers.peer.borrowed_from(lender.gpu);
            let cap = crate::lenders::recap(borrowed, memory.free, reserve, lender.most);
            let busy = memory.busy_percent.is_some_and(|p| p >= crate::peer_traffic::BUSY_PERCENT);
            self.tiers.peer.set_busy(lender.gpu, busy);
            if cap != self.tiers.peer.cap_of(&lender) {
                self.tiers.peer.set_cap(lender.gpu, cap);
            }
        }
        self.reclaim_peer("watch_lenders")
    }

    /// What GPU `gpu` lends becomes `bytes`; what it no longer lends is given back before this
    /// returns (chunks whose only copy was there copied to the host). Returns the bytes given back.
    pub(crate) fn set_peer_lending(&mut self, gpu: usize, bytes: usize) -> Result<usize> {
        if !self.tiers.peer.lenders().iter().any(|l| l.gpu == gpu) {
            let lenders: Vec<usize> = self.tiers.peer.lenders().iter().map(|l| l.gpu).collect();
            return Err(Error::Config(format!(
                "set_peer_lending: GPU {gpu} does not lend to this engine (its lenders: {lenders:?}; see Engine::peer_notes)"
            )));
        }
        self.tiers.peer.set_most(gpu, bytes);
        self.reclaim_peer("set_peer_lending")
    }

    /// Gives the peer tier's draining slabs back to their lenders (peer_tier.rs): chunks whose
    /// only copy is in one are copied to host slots (spilling the host tier to the file if it
    /// must), other copies there are dropped, and the emptied slabs are released. Returns the
    /// bytes given back. Waits under the lock: a lender asking for its memory comes first. A slab
    /// holding a chunk acquired in place (movement.rs, "Reading in place") goes back at a later call, once it is
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
        self.tiers.wait_here(call, landing)?;
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
            self.tiers.wait_here(call, vec![fence])?;
            for (&r, &slot) in group.iter().zip(&slots) {
                self.state.add_host_copy(r, slot);
                let peer = self.state.drop_peer_copy(r).expect("a peer copy");
                self.tiers.peer.free(peer);
            }
        }
        // Copies up still reading dropped peer slots hold them until they are done.
        while self.tiers.peer.draining_in_use() {
            let Some(fence) = self.tiers.in_flight.next_retired().cloned() else { break };
            self.tiers.wait_here(call, vec![fence])?;
            self.tiers.reap(&mut self.state)?;
        }
        self.tiers.peer.release_drained(self.tiers.device.as_ref()).during(call)
    }
}
