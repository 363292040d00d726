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

use crate::engine::Inner;
use crate::error::Context;
use crate::state::ChunkRef;
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
}
