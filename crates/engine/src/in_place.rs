//! Reading chunks in place: a chunk the peer tier holds is read where it lies, in a neighbour
//! GPU's HBM over NVLink, instead of coming into this GPU's HBM (memHarvester's remote access
//! to harvested memory).
//!
//! Its address is mapped to its peer slot: `cuMemMap` of the slot's own allocation (with
//! `TIERMEM_PEER_IN_PLACE`, peer_tier.rs makes one per slot), after unmapping whatever stale
//! mapping the address had, then one `cuMemSetAccess` per run of consecutive chunks. The chunk
//! stays located in the peer tier (state.rs, "Mapped in place") and an acquire pins it there,
//! with no copy and no HBM taken; it stays mapped after its release, so the next acquire costs
//! nothing. `policy::read_in_place` decides which chunks of an acquire are read in place: those
//! the caller allows (`Access::InPlaceOk`, or a buffer made `in_place`) for which free HBM is
//! short, those already mapped there, and those someone else holds there.
//!
//! The mapping is undone (`unmap_below`) before the chunk comes into HBM, gives its peer slot
//! up (reclaim), or its buffer is freed: so a slab with no slot in use has no mapping but its
//! own, and goes back to its lender whole. Undoing it first waits for the chunk's last use in
//! place (its `busy` fence), with the lock held: it is done by then in all but a program
//! switching a chunk from reads in place to reads in HBM while its last kernel still runs.

use crate::buffer::Access;
use crate::error::Context;
use crate::state::{ChunkRef, ChunkTable, Location};
use crate::tiers::Tiers;
use crate::{Error, Result};
use tiermem_mechanism::DeviceError;
use tiermem_policy::{read_in_place, PeerRead};

impl Tiers {
    /// Splits an acquire's chunks (sorted) into those read in place, mapped there now if they
    /// were not, and those to be made resident. Refused, changing nothing, for `ReadWrite` of a
    /// chunk someone holds in place.
    pub(crate) fn serve_in_place(
        &mut self,
        state: &mut ChunkTable,
        call: &'static str,
        refs: &[ChunkRef],
        access: Access,
    ) -> Result<(Vec<ChunkRef>, Vec<ChunkRef>)> {
        if !self.peer.exists() || !self.peer.readable_in_place() {
            return Ok((Vec::new(), refs.to_vec()));
        }
        if access == Access::ReadWrite {
            if let Some(&(buffer, _)) = refs.iter().find(|&&r| state.chunk(r).pinned_in_place()) {
                return Err(Error::AcquiredInPlace { call, buffer });
            }
        }
        let reads: Vec<PeerRead> = refs
            .iter()
            .map(|&r| {
                let chunk = state.chunk(r);
                match chunk.location() {
                    Location::Peer(_) if chunk.pinned_in_place() => PeerRead::Pinned,
                    // Its lender wants the slot back: read it in HBM.
                    Location::Peer(slot) if self.peer.is_draining(slot) => PeerRead::Elsewhere,
                    Location::Peer(_) if chunk.is_in_place() => PeerRead::Mapped,
                    Location::Peer(_) => PeerRead::Unmapped,
                    _ => PeerRead::Elsewhere,
                }
            })
            .collect();
        let missing = refs.iter().filter(|&&r| !state.chunk(r).is_resident()).count()
            - reads.iter().filter(|&&p| p != PeerRead::Elsewhere).count();
        let allowed = match access {
            Access::InPlaceOk => true,
            Access::ReadOnly => refs.iter().all(|&(id, _)| state.buffer(id).is_some_and(|b| b.options.in_place)),
            Access::ReadWrite => false,
        };
        let answer = read_in_place(&reads, missing, self.pool.available(), allowed);
        let (mut there, mut rest) = (Vec::new(), Vec::new());
        for (&r, in_place) in refs.iter().zip(answer) {
            if in_place {
                there.push(r)
            } else {
                rest.push(r)
            }
        }
        let to_map: Vec<ChunkRef> = there.iter().copied().filter(|&r| !state.chunk(r).is_in_place()).collect();
        self.map_in_place(state, &to_map).during(call)?;
        self.counters.in_place_reads += there.len() as u64;
        Ok((there, rest))
    }

    /// Maps each chunk of `refs` (sorted, located in the peer tier, not acquired) at its peer
    /// slot: per run of consecutive chunks, one `cuMemMap` each and one `cuMemSetAccess`. On
    /// failure the chunks of the failing run are as before (unmapped); earlier runs stay mapped.
    pub fn map_in_place(&mut self, state: &mut ChunkTable, refs: &[ChunkRef]) -> Result<(), DeviceError> {
        let g = self.chunk;
        let mut start = 0;
        while start < refs.len() {
            let mut end = start + 1;
            while end < refs.len() && refs[end] == (refs[end - 1].0, refs[end - 1].1 + 1) {
                end += 1;
            }
            let run = &refs[start..end];
            let mut mapped = Vec::with_capacity(run.len());
            let mut outcome = Ok(());
            for &r in run {
                outcome = self.unmap_below(state, r);
                let Location::Peer(slot) = state.chunk(r).location() else { unreachable!("a peer chunk") };
                let handle = self.peer.part(slot).expect("slabs readable in place");
                outcome = outcome.and_then(|()| self.device.map(state.va(r), handle));
                if outcome.is_err() {
                    break;
                }
                mapped.push(r);
            }
            if outcome.is_ok() {
                outcome = self.device.set_access(state.va(run[0]), run.len() * g);
            }
            if let Err(e) = outcome {
                for r in mapped {
                    // Unmapped, it is as before; else a mapping without access, undone later.
                    let undone = self.device.unmap(state.va(r), g).is_ok();
                    if !undone {
                        state.mapped_in_place(r, false);
                    }
                }
                return Err(e);
            }
            for &r in run {
                state.mapped_in_place(r, true);
            }
            self.counters.in_place_maps += run.len() as u64;
            start = end;
        }
        Ok(())
    }

    /// Undoes whatever chunk `r`'s address maps while it is not in HBM (a stale mapping, or its
    /// peer slot in place, after its last use there). Nothing to do if it maps nothing.
    pub fn unmap_below(&mut self, state: &mut ChunkTable, r: ChunkRef) -> Result<(), DeviceError> {
        let chunk = state.chunk(r);
        if !chunk.maps_below() {
            return Ok(());
        }
        debug_assert!(chunk.pins() == 0, "an acquired chunk keeps its mapping");
        if let Some(busy) = chunk.busy().filter(|_| chunk.phys().is_none()) {
            busy.wait()?;
        }
        self.device.unmap(state.va(r), self.chunk)?;
        state.unmapped(r);
        Ok(())
    }
}
