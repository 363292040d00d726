//! Moving chunks down: the tiers' mechanism (`impl Tiers`) for copies out of HBM into peer
//! or host slots (from the host tier to the file: file_tier.rs), and the bookkeeping of what has landed (`reap`, `detach_chunks`, `unmap_buffer`, giving
//! HBM beyond the budget back). movement.rs says how a copy down is ordered; placement.rs
//! (`host_slots`) what a page-out does when the host tier is full; where each chunk goes is the
//! policy crate's decision (`leave_hbm`).

use crate::error::Context;
use crate::fence::{after_all, settled, Fence};
use crate::host_tier::Slot;
use crate::runs::{batches, coalesce, Source};
use crate::state::{Below, ChunkRef, ChunkTable, Copies, Location};
use crate::tiers::Tiers;
use crate::BufferId;
use crate::{Error, Result};
use std::collections::HashSet;
use tiermem_policy::{leave_hbm, Leave, Tier};

/// The tiers that take copies of dirty chunks leaving HBM, fastest first: a neighbour GPU's
/// lent HBM while it has room, else the host. The file tier is reached through the host tier.
pub(crate) const COPIES_OUT_OF_HBM: [Tier; 2] = [Tier::Peer, Tier::Host];
use std::sync::Arc;
use tiermem_mechanism::{DeviceError, PhysHandle, StreamHandle};

impl Tiers {
    /// Moves the clean chunks among `refs` (resident, unacquired, sorted) out of HBM: at once if
    /// nothing can still touch them, else behind a fence. Returns the dirty ones, which need
    /// host slots, and the fences after which the clean ones will have left.
    pub fn send_clean_down(
        &mut self,
        state: &mut ChunkTable,
        call: &'static str,
        refs: &[ChunkRef],
    ) -> Result<(Vec<ChunkRef>, Vec<Arc<Fence>>)> {
        let mut clean = Vec::new();
        let mut dirty = Vec::new();
        for &r in refs {
            let chunk = state.chunk(r);
            if !chunk.is_resident() {
                continue;
            }
            // Which tier takes its copy is decided with the slots in hand (`Inner::send_down`);
            // room in the host tier is made as its slots are taken (`Inner::host_slots`).
            match leave_hbm(chunk.copy_below(), &COPIES_OUT_OF_HBM, |_| true) {
                Leave::CopyTo(_) => dirty.push(r),
                Leave::Drop { .. } => clean.push(r),
            }
        }
        let fences = self.leave_without_copy(state, call, &clean)?;
        self.counters.clean_drops += clean.len() as u64;
        Ok((dirty, fences))
    }

    /// Takes resident, unacquired chunks (sorted) out of HBM without copying them: clean ones,
    /// or ones whose bytes are no longer wanted (`Inner::discard`). At once if nothing can
    /// still touch them, else behind a fence; returns the fences after which they will have left.
    pub fn leave_without_copy(
        &mut self,
        state: &mut ChunkTable,
        call: &'static str,
        refs: &[ChunkRef],
    ) -> Result<Vec<Arc<Fence>>> {
        let mut fences: Vec<Arc<Fence>> = Vec::new();
        let mut drop_now = Vec::new();
        for &r in refs {
            // It may leave only after both its last use and the copy that filled its slot or
            // its HBM (cancelled page-outs leave that copy in flight): the first of them done
            // proves nothing of the other.
            let in_flight: Vec<Arc<Fence>> = state.chunk(r).in_flight().cloned().collect();
            match after_all(&self.events, self.streams.down, &in_flight).during(call)? {
                None => drop_now.push(r),
                Some(fence) => {
                    state.start_leaving(r, Arc::clone(&fence), None);
                    if !fences.iter().any(|f| Arc::ptr_eq(f, &fence)) {
                        fences.push(Arc::clone(&fence));
                    }
                    self.in_flight.moving_down(fence, vec![r]);
                }
            }
        }
        self.detach_chunks(state, &drop_now);
        Ok(fences)
    }

    /// Copies dirty resident chunks (sorted) down into `slots` (one each, peer or host);
    /// returns one fence per batch.
    pub fn copy_dirty_down(
        &mut self,
        state: &mut ChunkTable,
        call: &'static str,
        dirty: &[ChunkRef],
        slots: Vec<Below>,
    ) -> Result<Vec<Arc<Fence>>> {
        let mut fences = Vec::new();
        let down = self.streams.down;
        let mut awaited: Vec<Arc<Fence>> = Vec::new();
        for &r in dirty {
            for fence in state.chunk(r).in_flight() {
                if !fence.is_done().during(call)? && !awaited.iter().any(|a| Arc::ptr_eq(a, fence)) {
                    awaited.push(Arc::clone(fence));
                }
            }
        }
        for fence in &awaited {
            self.device.stream_wait_event(down, fence.event()).during(call)?;
        }
        let mut next_slot = 0;
        for batch in batches(dirty, self.batch) {
            let batch_slots = &slots[next_slot..next_slot + batch.len()];
            if let Err(e) = self.copy_down(state, batch, batch_slots, down) {
                slots[next_slot..].iter().for_each(|&s| self.free_below(s));
                return Err(Error::Device { call, source: e });
            }
            next_slot += batch.len();
            let fence = self.events.record(down).during(call)?;
            for (&r, &slot) in batch.iter().zip(batch_slots) {
                state.start_leaving(r, Arc::clone(&fence), Some(slot));
            }
            self.counters.page_outs += batch.len() as u64;
            self.in_flight.moving_down(Arc::clone(&fence), batch.to_vec());
            fences.push(fence);
        }
        Ok(fences)
    }

    /// Enqueues the copies of one batch of consecutive chunks into `slots`: over PCIe into host
    /// slots, over NVLink into peer slots.
    pub(crate) fn copy_down(
        &mut self,
        state: &mut ChunkTable,
        batch: &[ChunkRef],
        slots: &[Below],
        stream: StreamHandle,
    ) -> Result<(), DeviceError> {
        let g = self.chunk;
        let va0 = state.va(batch[0]);
        let targets: Vec<Source> = slots.iter().map(|&s| self.source_of(s)).collect();
        for (k, n, dst) in coalesce(&targets, g) {
            let src = va0 + (k * g) as u64;
            let copied = match dst {
                // SAFETY: the slots were just allocated for these chunks and nothing else uses
                // them; the chunks stay mapped (leaving) until this copy's fence has completed.
                Source::Host(dst, _) => unsafe { self.device.copy_to_host_async(dst, src, n * g, stream) },
                Source::Peer(dst, _) => self.device.copy_between_devices_async(dst, src, n * g, stream),
                Source::Zeros | Source::File => unreachable!("every chunk has a slot"),
            };
            if let Err(e) = copied {
                let _ = self.device.synchronize_stream(stream);
                return Err(e);
            }
        }
        Ok(())
    }

    /// The fence whose completion will next let a host slot be freed or spilled: a slot a copy
    /// still reads, a chunk still being copied down, a clean copy a copy up still reads.
    pub(crate) fn next_host_release(&self, state: &ChunkTable) -> Option<Arc<Fence>> {
        if let Some(fence) = self.in_flight.next_retired().or(self.in_flight.next_landing()) {
            return Some(Arc::clone(fence));
        }
        state.chunks().find_map(|(_, chunk)| match chunk.ready() {
            Some(ready) if chunk.is_resident() && chunk.host().is_some() && !matches!(ready.is_done(), Ok(true)) => {
                Some(Arc::clone(ready))
            }
            _ => None,
        })
    }

    /// Who holds the host tier's slots, for an out-of-memory message.
    pub(crate) fn host_holders(&self, state: &ChunkTable) -> String {
        let (mut data, mut copies, mut moving) = (0, 0, 0);
        for (_, chunk) in state.chunks() {
            match (chunk.location(), chunk.host()) {
                (Location::Host(_), _) => data += 1,
                (Location::Hbm { leaving: false, .. }, Some(_)) => copies += 1,
                (Location::Hbm { leaving: true, .. }, Some(_)) => moving += 1,
                _ => {}
            }
        }
        format!(
            "held by {data} chunks' data, {copies} copies of resident chunks, {moving} chunks moving down, {} slots \
             still read by copies, {} slots let go but still read by file writes",
            self.in_flight.retiring(),
            self.host.freed_while_held_count()
        )
    }

    /// Frees up to `wanted` host slots that only held copies of chunks still resident in HBM.
    pub(crate) fn reclaim_host_copies(&mut self, state: &mut ChunkTable, wanted: usize) {
        self.reclaim_spare_copies(state, wanted, Tier::Host);
    }

    /// Frees up to `wanted` peer slots that only held copies of chunks still resident in HBM.
    pub(crate) fn reclaim_peer_copies(&mut self, state: &mut ChunkTable, wanted: usize) -> usize {
        self.reclaim_spare_copies(state, wanted, Tier::Peer)
    }

    /// Frees up to `wanted` slots of `tier` (host or peer) that held copies of chunks resident
    /// in HBM whose arrival has completed (nothing still reads the copy). Returns how many.
    fn reclaim_spare_copies(&mut self, state: &mut ChunkTable, wanted: usize, tier: Tier) -> usize {
        let has_copy = |c: &crate::state::Chunk| match tier {
            Tier::Peer => c.peer().is_some(),
            _ => c.host().is_some(),
        };
        // A host copy of a chunk in the peer tier (movement.rs, "Cleaning borrowed chunks") is a spare too.
        let spare_below = |c: &crate::state::Chunk| {
            tier == Tier::Host && c.phys().is_none() && c.peer().is_some() && c.host().is_some() && c.pins() == 0
        };
        let spare: Vec<ChunkRef> = state
            .chunks()
            .filter(|(_, c)| {
                (c.is_resident() && has_copy(c) && matches!(settled(c.ready()), Ok(true))) || spare_below(c)
            })
            .map(|(r, _)| r)
            .take(wanted)
            .collect();
        for &r in &spare {
            let slot = match tier {
                Tier::Peer => Below::Peer(state.drop_peer_copy(r).expect("a peer copy")),
                _ => Below::Host(state.drop_host_copy(r).expect("a host copy")),
            };
            self.free_below(slot);
        }
        spare.len()
    }

    /// Chunks leave HBM: their physical chunks go back to the pool, and their bytes are where
    /// their copies are (host or file). Their mappings stay, stale (`alias`): no driver call.
    /// Nothing may still use them (their fences have completed).
    pub fn detach_chunks(&mut self, state: &mut ChunkTable, refs: &[ChunkRef]) {
        let mut refs = refs.to_vec();
        refs.sort_unstable();
        // A chunk sent down, brought back and sent down again behind the same fence sits in two
        // landed groups: detach it once.
        refs.dedup();
        for r in refs {
            let phys = state.leave_hbm(r);
            self.pool.give(phys);
        }
    }

    /// Unmaps a buffer's chunks for `free`: resident ones leave HBM (`Empty` unless a slot or the
    /// file holds their data), stale mappings go. Each chunk is marked as soon as it is
    /// unmapped, so after a failure a retry unmaps only what is still mapped.
    pub fn unmap_buffer(&mut self, state: &mut ChunkTable, id: BufferId) -> Result<(), DeviceError> {
        let chunks = state.buffer(id).expect("a live buffer").chunks().len();
        for index in 0..chunks {
            let r = (id, index);
            let chunk = state.chunk(r);
            let in_hbm = chunk.phys().is_some();
            if !in_hbm && !chunk.maps_below() {
                continue;
            }
            self.device.unmap(state.va(r), self.chunk)?;
            if in_hbm {
                let phys = state.leave_hbm(r);
                self.pool.give(phys);
            }
            state.unmapped(r);
        }
        Ok(())
    }

    /// Completes whatever has finished: chunks whose copy down landed leave HBM, host slots
    /// whose readers are done are freed, demand-copy timings are added up. Never blocks.
    pub fn reap(&mut self, state: &mut ChunkTable) -> Result<()> {
        let landed = self.in_flight.landed().during("reap")?;
        let mut items = Vec::new();
        for group in &landed {
            for &r in &group.chunks {
                let Some(buffer) = state.buffer(r.0) else { continue };
                if buffer.chunks()[r.1].leaving().is_some_and(|fence| Arc::ptr_eq(fence, &group.fence)) {
                    items.push(r);
                }
            }
        }
        self.detach_chunks(state, &items);
        for slot in self.in_flight.retired().during("reap")? {
            self.free_below(slot);
        }
        // Chunks beyond a budget that shrank go back to the driver as they become idle.
        if self.pool.releasable(self.pool.cap()) > 0 {
            self.release_idle_beyond(state, "reap", self.pool.cap())?;
        }
        self.counters.stall_ms += self.in_flight.timed_ms().during("reap")?;
        Ok(())
    }

    /// Gives idle physical chunks back to the driver until no more than `limit` exist (or no
    /// idle one is left); stale mappings of them are unmapped first. Returns how many.
    pub(crate) fn release_idle_beyond(
        &mut self,
        state: &mut ChunkTable,
        call: &'static str,
        limit: usize,
    ) -> Result<usize> {
        let (chunks, still_read): (Vec<PhysHandle>, Vec<PhysHandle>) =
            self.pool.take_idle(self.pool.releasable(limit)).into_iter().partition(|&p| !self.in_flight.still_read(p));
        // Handed over by a chunk whose copy down still reads it: given back at a later reap.
        still_read.into_iter().for_each(|p| self.pool.give(p));
        if chunks.is_empty() {
            return Ok(0);
        }
        let released = self.release_chunks(state, &chunks);
        let count = *released.as_ref().unwrap_or(&0);
        released.during(call).map(|_| count)
    }

    /// Unmaps the stale mappings of `chunks` (taken from the idle pool) and releases them; on a
    /// failure the chunks not yet released go back to the pool. Returns how many were released.
    pub(crate) fn release_chunks(
        &mut self,
        state: &mut ChunkTable,
        chunks: &[PhysHandle],
    ) -> std::result::Result<usize, tiermem_mechanism::DeviceError> {
        let g = self.chunk;
        let idle: HashSet<PhysHandle> = chunks.iter().copied().collect();
        let stale: Vec<ChunkRef> =
            state.chunks().filter(|(_, c)| c.alias().is_some_and(|p| idle.contains(&p))).map(|(r, _)| r).collect();
        let mut outcome = Ok(());
        for r in stale {
            outcome = self.device.unmap(state.va(r), g);
            if outcome.is_err() {
                break;
            }
            state.unmapped(r);
        }
        let mut released = 0;
        for &p in chunks {
            if outcome.is_ok() {
                outcome = self.pool.release(self.device.as_ref(), p);
                released += usize::from(outcome.is_ok());
                if outcome.is_ok() {
                    continue;
                }
            }
            self.pool.give(p);
        }
        outcome.map(|()| released)
    }

    /// Frees a host or peer slot now, or once `reader` (a copy from it) has completed.
    pub(crate) fn retire(&mut self, slot: Below, reader: Option<Arc<Fence>>) {
        match reader {
            Some(fence) if !matches!(fence.is_done(), Ok(true)) => self.in_flight.retire(fence, slot),
            _ => self.free_below(slot),
        }
    }

    /// Gives up a chunk's copies below HBM: its host and peer slots once `reader` (a copy from
    /// one of them) has completed, its file slot at once (no read of it may be in flight).
    pub(crate) fn give_up(&mut self, copies: Copies, reader: Option<Arc<Fence>>) {
        for slot in copies.peer.map(Below::Peer).into_iter().chain(copies.host.map(Below::Host)) {
            self.retire(slot, reader.clone());
        }
        self.free_file_slots(copies.file.as_slice());
    }

    /// Copies the bytes of peer-located chunks (`refs`, one host slot each in `slots`) from
    /// their peer slots into host memory, on the down stream; returns the fence of the copies.
    /// The chunks change only once the caller has seen the fence complete.
    pub(crate) fn copy_peer_to_host(
        &mut self,
        state: &ChunkTable,
        call: &'static str,
        refs: &[ChunkRef],
        slots: &[Slot],
    ) -> Result<Arc<Fence>> {
        let g = self.chunk;
        let pairs: Vec<(Source, Source)> = refs
            .iter()
            .zip(slots)
            .map(|(&r, &slot)| {
                let peer = state.chunk(r).peer().expect("a peer-located chunk");
                (self.source_of(Below::Peer(peer)), self.source_of(Below::Host(slot)))
            })
            .collect();
        // A run continues while both sides stay adjacent, each within one slab.
        let continues = |first: &(Source, Source), k: usize, item: &(Source, Source)| match (*first, *item) {
            ((Source::Peer(a, s), Source::Host(b, t)), (Source::Peer(c, u), Source::Host(d, v))) => {
                s == u && t == v && c == a + (k * g) as u64 && d == b + k * g
            }
            _ => false,
        };
        let down = self.streams.down;
        for (start, n) in crate::runs::runs(&pairs, usize::MAX, continues) {
            let (Source::Peer(src, _), Source::Host(dst, _)) = pairs[start] else { unreachable!("peer to host") };
            // SAFETY: the host slots were just allocated for these chunks and nothing else uses
            // them; the peer slots hold the chunks' bytes and are not freed before the fence.
            unsafe { self.device.copy_to_host_async(dst, src, n * g, down) }.during(call)?;
        }
        self.events.record(down).during(call)
    }

    /// Gives a host or peer slot back to its tier.
    pub(crate) fn free_below(&mut self, slot: Below) {
        match slot {
            Below::Host(slot) => self.host.free(slot),
            Below::Peer(slot) => self.peer.free(slot),
        }
    }

    /// Where a copy finds (or puts) the bytes of a host or peer slot.
    pub(crate) fn source_of(&self, slot: Below) -> Source {
        match slot {
            Below::Host(slot) => Source::Host(self.host.addr(slot), self.host.slab(slot)),
            Below::Peer(slot) => Source::Peer(self.peer.addr(slot), self.peer.slab(slot)),
        }
    }

    /// Sends back to `File` those of `refs` whose background read from the file failed: their
    /// bytes are still in the file, their HBM goes back to the pool. Waits for reads not yet
    /// done with the disk. Returns the first failure.
    pub(crate) fn undo_failed_reads(&mut self, state: &mut ChunkTable, refs: &[ChunkRef]) -> Option<Error> {
        let mut failure = None;
        let mut undo = Vec::new();
        for &r in refs {
            let chunk = state.chunk(r);
            let Some(Err(e)) = chunk.ready().map(|fence| fence.recorded()) else { continue };
            if chunk.is_resident() {
                undo.push(r);
            }
            failure.get_or_insert(e);
        }
        self.detach_chunks(state, &undo);
        failure
    }
}
