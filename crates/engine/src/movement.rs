//! Moving chunks up: the tiers' mechanism (`impl Tiers`) for bringing chunks into HBM, once
//! placement.rs has planned what comes in and made room for it; reading chunks in place in a
//! neighbour's HBM; cleaning borrowed chunks. Chunks go down in down.rs.
//!
//! **Up** (`bring_in`): take physical chunks from the pool (evicting if a demand needs it; a
//! prefetch takes only what is free), then per batch of up to `batch_chunks` consecutive
//! chunks: map each chunk, one `cuMemSetAccess` for the batch, and one asynchronous copy per
//! run of chunks whose host slots are adjacent (never-written chunks get one memset
//! instead). Copies are enqueued as soon as their batch is mapped, so the CPU maps batch k+1
//! while the copy engine moves batch k: the link stays busy. One fence after the last batch
//! is the chunks' `ready` fence, which acquiring streams wait on — on the device, not the host.
//!
//! **Down** (`send_down`): a clean chunk (identical host copy) leaves HBM at once if nothing
//! can still touch it, or after the fence of its last use. A dirty chunk gets a host slot
//! (contiguous runs where possible), the down stream waits on the chunk's last-use fence
//! (device-side), the copy is enqueued, and a fence per batch marks it. The chunk stays
//! mapped, `PagingOut`, until its fence completes; `reap` then returns its HBM chunk to the
//! pool. Leaving HBM makes no driver call: the mapping stays, stale (`Chunk::alias`), and a
//! chunk coming back to the same physical chunk needs no mapping either (state.rs says why).
//!
//! **A driver fact that shapes the schedule** (H200, driver 580): `cuMemMap`/`cuMemSetAccess`
//! wait for copies *to the host* that are in flight — during a 1 GiB copy down, mapping 16
//! chunks took 17 ms instead of 0.35 ms — while copies up and `cuMemUnmap` delay nothing. So
//! mapping overlaps copies up but never copies down: `exchange` maps its incoming chunks before
//! it issues its outgoing copies, and evictions finish their copies before the freed chunks
//! are mapped again.
//!
//! **Room**: placement.rs (`make_room`). The copies down, and the bookkeeping of chunks that
//! have left (`reap`), are in down.rs. Streams: `up` for demand, `prefetch` (low priority) for prefetches,
//! `down` for page-outs, so the two directions overlap on the two copy engines.
//!
//! **Reading in place.** A chunk the peer tier holds is read where it lies, in a neighbour
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
//!
//! **Cleaning borrowed chunks** (`clean_borrowed`: keeping borrowed HBM removable, memHarvester
//! §4.2): chunks whose only copy is in a
//! neighbour's HBM are copied to free host slots in the background, so that a lender taking
//! its memory back needs no copy — an unmap — and a borrower that does not answer in time
//! loses nothing.
//!
//! The lender watch (every poll) copies a batch of such chunks, at most
//! `lender_watch::CLEAN_BATCH` a poll: peer-located, not in HBM, with no host or file copy, not acquired
//! in place. Only free host room is used: cleaning never evicts, spills or waits for slots,
//! and the host copies it makes are spares, which the host tier takes back first when it
//! needs room (`Tiers::reclaim_host_copies`). It waits for its copy (a batch: ~1 ms) with
//! the lock held, like a reclaim. A chunk whose bytes change later comes into HBM first,
//! which gives up every copy below (`take_copies`): a host copy made here is never stale.

use crate::buffer::Access;
use crate::error::Context;
use crate::fence::Fence;
use crate::runs::{batches, coalesce, Source};
use crate::state::{Below, ChunkRef, ChunkTable, Fill, Location};
use crate::tiers::Tiers;
use crate::{Error, Result};
use std::sync::Arc;
use tiermem_mechanism::file_store::FileSlot;
use tiermem_mechanism::{DeviceError, DevicePtr, HostPtr, PhysHandle, StreamHandle};
use tiermem_policy::{read_in_place, split_between_paths, PeerRead};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// Needed now: may evict.
    Demand,
    /// Wanted soon: only free HBM, on the low-priority stream.
    Prefetch,
    /// Needed `horizon` steps from now by the schedule: on the low-priority stream, evicting
    /// only chunks whose next use is further away.
    Ahead { horizon: u64 },
    /// Needed `horizon` steps from now, beyond the window (schedule.rs, "Looking past resident
    /// steps"): on the low-priority stream, in exchange for streamed chunks that have finished
    /// their work and sit in the incoming chunks' homes (homes.rs), or into free HBM; nothing
    /// else is evicted and nothing is waited for.
    Swap { horizon: u64 },
}

impl Tiers {
    /// Maps `todo` (sorted, none in HBM) at `phys` (one each) and copies their bytes up: from
    /// host slots, zeros, or the file through the background reader. Returns the fences after
    /// which every chunk has arrived.
    pub fn copy_in(
        &mut self,
        state: &mut ChunkTable,
        call: &'static str,
        todo: &[ChunkRef],
        phys: Vec<PhysHandle>,
        purpose: Purpose,
    ) -> Result<Vec<Arc<Fence>>> {
        let stream = match purpose {
            Purpose::Demand => self.streams.up,
            Purpose::Prefetch | Purpose::Ahead { .. } | Purpose::Swap { .. } => self.streams.prefetch,
        };
        let start = match purpose {
            Purpose::Demand => Some(self.events.record(stream).during(call)?),
            Purpose::Prefetch | Purpose::Ahead { .. } | Purpose::Swap { .. } => None,
        };
        // Chunks coming from the file are read in the background (file_reads.rs), a group at a
        // time, each behind a fence of its own; those fences are made first, so that nothing
        // is mapped unless every read can be queued.
        let group = crate::file_reads::GROUP_BATCHES * self.batch;
        let from_file = todo.iter().filter(|&&r| matches!(state.chunk(r).location(), Location::File(_))).count();
        let mut read_fences = Vec::with_capacity(from_file.div_ceil(group));
        for _ in 0..from_file.div_ceil(group) {
            match self.events.later() {
                Ok(fence) => read_fences.push(fence),
                Err(e) => {
                    phys.into_iter().for_each(|p| self.pool.give(p));
                    return Err(Error::Device { call, source: e });
                }
            }
        }
        let mut read_fences = read_fences.into_iter();
        let mut phys = phys.into_iter();
        let (mut landed, mut reads, mut fences) = (Vec::new(), Vec::new(), Vec::new());
        let (mut read, mut failure) = (0, None);
        for batch in batches(todo, self.batch) {
            let batch_phys: Vec<PhysHandle> = phys.by_ref().take(batch.len()).collect();
            let file_chunks: Vec<(ChunkRef, FileSlot)> = batch
                .iter()
                .filter_map(|&r| match state.chunk(r).location() {
                    Location::File(slot) => Some((r, slot)),
                    _ => None,
                })
                .collect();
            if let Err(e) = self.copy_up(state, batch, &batch_phys, stream) {
                failure = Some(Error::Device { call, source: e });
                break;
            }
            landed.extend(batch.iter().copied().filter(|r| !file_chunks.iter().any(|(f, _)| f == r)));
            read += file_chunks.len();
            reads.extend(file_chunks);
            while reads.len() >= group {
                let rest = reads.split_off(group);
                fences.push(self.queue_read(state, call, std::mem::replace(&mut reads, rest), &mut read_fences));
            }
        }
        if !reads.is_empty() {
            fences.push(self.queue_read(state, call, reads, &mut read_fences));
        }
        phys.for_each(|p| self.pool.give(p));
        // The chunks' fence (or a failure) must come after the copies along other paths.
        if let Err(e) = self.multipath.join(self.device.as_ref(), stream) {
            failure.get_or_insert(Error::Device { call, source: e });
        }
        if start.is_none() {
            self.counters.prefetched += (landed.len() + read) as u64;
        }
        if landed.is_empty() {
            return failure.map_or(Ok(fences), Err);
        }
        let fence = match self.events.record(stream) {
            Ok(fence) => fence,
            Err(e) => {
                // Without a fence nobody could wait for the copies: finish them now.
                self.device.synchronize_stream(stream).during(call)?;
                return Err(Error::Device { call, source: e });
            }
        };
        for &r in &landed {
            state.set_ready(r, Some(Arc::clone(&fence)));
        }
        if let Some(start) = start {
            self.in_flight.time(start, Arc::clone(&fence));
        }
        fences.push(fence);
        failure.map_or(Ok(fences), Err)
    }

    /// Hands `reads` (chunks just mapped, whose bytes are only in the file) to the background
    /// reader behind the next of `fences`, which becomes their `ready` fence. Returns it.
    pub(crate) fn queue_read(
        &mut self,
        state: &mut ChunkTable,
        call: &'static str,
        reads: Vec<(ChunkRef, FileSlot)>,
        fences: &mut impl Iterator<Item = Arc<Fence>>,
    ) -> Arc<Fence> {
        let fence = fences.next().expect("one fence was made per group");
        let mut items = Vec::with_capacity(reads.len());
        for (r, file) in reads {
            items.push((file, state.va(r)));
            state.set_ready(r, Some(Arc::clone(&fence)));
        }
        self.counters.file_reads += items.len() as u64;
        let tier = self.file.as_ref().expect("File chunks exist only with a file tier");
        tier.reader.submit(crate::file_reads::ReadGroup { call, items, fence: Arc::clone(&fence) });
        fence
    }

    /// Physical chunks for `todo`, one each, for as many of its first chunks as the pool can
    /// serve: a chunk whose stale mapping points at an idle physical chunk takes that one (it
    /// needs no driver call), the others whatever is idle or can still be created.
    pub(crate) fn take_phys(
        &mut self,
        state: &ChunkTable,
        call: &'static str,
        todo: &[ChunkRef],
    ) -> Result<Vec<PhysHandle>> {
        let aliases: Vec<Option<PhysHandle>> = todo.iter().map(|&r| state.chunk(r).alias()).collect();
        let mut phys: Vec<Option<PhysHandle>> =
            aliases.into_iter().map(|alias| alias.filter(|&p| self.pool.take_exact(p))).collect();
        for slot in phys.iter_mut().filter(|slot| slot.is_none()) {
            match self.pool.take(self.device.as_ref()) {
                Ok(Some(p)) => *slot = Some(p),
                Ok(None) => break,
                Err(e) => {
                    phys.into_iter().flatten().for_each(|p| self.pool.give(p));
                    return Err(Error::Device { call, source: e });
                }
            }
        }
        let served = phys.iter().position(Option::is_none).unwrap_or(phys.len());
        phys[served..].iter().flatten().for_each(|&p| self.pool.give(p));
        Ok(phys[..served].iter().flatten().copied().collect())
    }

    /// Makes `stream` wait for the moves down that a copy of `batch` into `phys` must follow
    /// (hand_overs.rs): those of the chunks that handed `phys` over, and those
    /// still filling the slots `batch` comes from. A chunk of the batch read from the file
    /// (on the reader's own stream) has its physical chunk's move waited for here, on the
    /// host. Returns whether the stream waits for any.
    fn behind_moves_down(
        &mut self,
        state: &ChunkTable,
        batch: &[ChunkRef],
        phys: &[PhysHandle],
        stream: StreamHandle,
    ) -> Result<bool, DeviceError> {
        let mut fences = self.in_flight.take_handed(phys)?;
        if !fences.is_empty() && batch.iter().any(|&r| matches!(state.chunk(r).location(), Location::File(_))) {
            self.wait_counted(&fences)?;
            fences.clear();
        }
        for landing in batch.iter().filter_map(|&r| state.chunk(r).landing()) {
            if !landing.is_done()? && !fences.iter().any(|f| Arc::ptr_eq(f, landing)) {
                fences.push(Arc::clone(landing));
            }
        }
        for fence in &fences {
            self.device.stream_wait_event(stream, fence.event())?;
        }
        Ok(!fences.is_empty())
    }

    /// Maps one batch of consecutive chunks of one buffer and enqueues their copies up: from
    /// their host slots, or zeros. Chunks whose bytes are in the file are only mapped: the
    /// caller queues their reads. On failure every chunk of the batch is as before and its
    /// physical chunks are back in the pool.
    pub(crate) fn copy_up(
        &mut self,
        state: &mut ChunkTable,
        batch: &[ChunkRef],
        phys: &[PhysHandle],
        stream: StreamHandle,
    ) -> Result<(), DeviceError> {
        let g = self.chunk;
        let va0 = state.va(batch[0]);
        let device = Arc::clone(&self.device);
        let waits = self.behind_moves_down(state, batch, phys, stream)?;
        // Chunks still mapped at their physical chunk need nothing; a stale mapping elsewhere,
        // or a mapping in place at its peer slot (movement.rs, "Reading in place"), is unmapped first.
        let mut fresh = Vec::new();
        let mut outcome = Ok(());
        for (i, (&r, &p)) in batch.iter().zip(phys).enumerate() {
            let va = va0 + (i * g) as u64;
            let chunk = state.chunk(r);
            if chunk.maps(p) {
                continue;
            }
            // Its own move down, handed over, may still read through the stale mapping.
            if let Some(landing) = chunk.landing().filter(|l| !matches!(l.is_done(), Ok(true))) {
                self.wait_counted(std::slice::from_ref(landing))?;
            }
            outcome = self.unmap_below(state, r);
            if outcome.is_err() {
                break;
            }
            outcome = device.map(va, p);
            if outcome.is_err() {
                break;
            }
            fresh.push((r, p, va));
            self.counters.maps += 1;
        }
        if outcome.is_ok() && !fresh.is_empty() {
            outcome = device.set_access_from(va0, batch.len() * g, self.multipath.access());
        }
        if outcome.is_ok() {
            let sources: Vec<Source> = batch
                .iter()
                .map(|&r| match state.chunk(r).location() {
                    Location::Peer(slot) => self.source_of(Below::Peer(slot)),
                    Location::Host(slot) => self.source_of(Below::Host(slot)),
                    Location::File(_) => Source::File,
                    Location::Empty | Location::Hbm { .. } => Source::Zeros,
                })
                .collect();
            let runs = coalesce(&sources, g);
            let from_host: Vec<(usize, usize, HostPtr)> = runs
                .iter()
                .filter_map(|&(k, n, source)| match source {
                    Source::Host(src, _) => Some((k, n, src)),
                    _ => None,
                })
                .collect();
            outcome = self.copy_from_host(&from_host, va0, stream, waits);
            for (k, n, source) in runs {
                let dst = va0 + (k * g) as u64;
                if outcome.is_err() {
                    break;
                }
                outcome = match source {
                    // Over NVLink, run by this GPU, which has access to the peer tier's slabs.
                    Source::Peer(src, slab) => {
                        self.peer.charge_slab(slab, n * g);
                        device.copy_between_devices_async(dst, src, n * g, stream)
                    }
                    Source::Zeros => device.memset_async(dst, 0, n * g, stream),
                    Source::Host(..) | Source::File => Ok(()),
                };
            }
            if outcome.is_err() {
                // Copies already enqueued must not land in chunks handed to someone else.
                let _ = device.synchronize_stream(stream);
                let _ = self.multipath.synchronize();
            }
        }
        if let Err(e) = outcome {
            if waits {
                // The physical chunks go back to the pool: no move down may still read them.
                let _ = device.synchronize_stream(stream);
            }
            // An unmap that fails here leaves a mapping without access (if `cuMemSetAccess`
            // failed): recorded as a stale mapping to unmap before the next map, and by `free`.
            // (Unrecorded, it made freeing the buffer fail for ever.)
            for (r, p, va) in fresh {
                if device.unmap(va, g).is_err() {
                    state.mapped_without_access(r, p);
                }
            }
            phys.iter().for_each(|&p| self.pool.give(p));
            return Err(e);
        }
        for (&r, &p) in batch.iter().zip(phys) {
            match state.enter_hbm(r, p) {
                Fill::Copied => self.counters.page_ins += 1,
                Fill::Zeroed => self.counters.zero_fills += 1,
            }
        }
        Ok(())
    }

    /// Queues the copies of `runs` (chunk index in the batch at `va0`, chunks, pinned host
    /// source) into HBM: on `stream`, or divided between it and the lenders' links while they
    /// lend (multipath.rs).
    /// `behind`: the stream waits for moves down (`behind_moves_down`), which the lenders'
    /// streams would not (they fork from it once per page-in), so the copies take this GPU's
    /// link alone.
    fn copy_from_host(
        &mut self,
        runs: &[(usize, usize, HostPtr)],
        va0: DevicePtr,
        stream: StreamHandle,
        behind: bool,
    ) -> Result<(), DeviceError> {
        let g = self.chunk;
        let peer = &self.peer;
        // A busy lender's link is its program's (peer_traffic.rs).
        let lending = |gpu| peer.lenders().iter().any(|l| l.gpu == gpu && peer.cap_of(l) > 0) && !peer.is_busy(gpu);
        let helpers = if behind { Vec::new() } else { self.multipath.usable(lending) };
        let lens: Vec<usize> = runs.iter().map(|&(_, n, _)| n).collect();
        let least = crate::multipath::LEAST_CHUNKS_PER_PATH;
        for piece in split_between_paths(&lens, 1 + helpers.len(), least) {
            let (k, _, src) = runs[piece.run];
            let (dst, src) = (va0 + ((k + piece.skip) * g) as u64, src + piece.skip * g);
            let len = piece.chunks * g;
            match piece.path {
                // SAFETY: the slots are pinned memory owned by these chunks, freed only after
                // the chunks' fence.
                0 => unsafe { self.device.copy_to_device_async(dst, src, len, stream)? },
                path => {
                    let device = Arc::clone(&self.device);
                    // SAFETY: as above; the chunks' fence comes after `stream` joins the
                    // helpers (copy_in).
                    unsafe { self.multipath.copy(device.as_ref(), helpers[path - 1], dst, src, len, stream)? };
                    self.counters.by_neighbours += piece.chunks as u64;
                }
            }
        }
        Ok(())
    }

    pub(crate) fn describe_tiers(&self, state: &ChunkTable) -> String {
        let g = self.chunk;
        let file = self.file.as_ref().map_or(String::new(), |tier| {
            format!(", file {} of {} bytes in use", tier.store.used_slots() * g, tier.store.capacity_slots() * g)
        });
        format!(
            "HBM {} of {} bytes in use ({} acquired), host {} of {} bytes in use{file}",
            self.pool.in_use() * g,
            self.pool.cap() * g,
            state.pinned() * g,
            self.host.in_use() * g,
            self.host.cap() * g
        )
    }

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

    /// Copies up to `most` chunks whose only copy is in the peer tier to free host slots.
    /// Returns how many are clean now.
    pub(crate) fn clean_borrowed(&mut self, state: &mut ChunkTable, most: usize) -> Result<usize> {
        let call = "clean_borrowed";
        let peer = &mut self.peer;
        let dirty: Vec<ChunkRef> = state
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
            if let Some(slots) = self.host.alloc(self.device.as_ref(), want).during(call)? {
                break slots;
            }
            want /= 2;
        };
        let refs = &dirty[..slots.len()];
        let fence = match self.copy_peer_to_host(&*state, call, refs, &slots) {
            Ok(fence) => fence,
            Err(e) => {
                slots.into_iter().for_each(|s| self.host.free(s));
                return Err(e);
            }
        };
        if let Err(e) = self.wait_here(call, vec![fence]) {
            // No copy may land in slots given to someone else.
            let _ = self.device.synchronize_stream(self.streams.down);
            slots.into_iter().for_each(|s| self.host.free(s));
            return Err(e);
        }
        for (&r, &slot) in refs.iter().zip(&slots) {
            state.add_host_copy(r, slot);
        }
        self.counters.cleaned += refs.len() as u64;
        Ok(refs.len())
    }

    /// Waits for `fences` with the lock held (the calls that may not retry), counted as
    /// eviction waits.
    pub(crate) fn wait_here(&mut self, call: &'static str, fences: Vec<Arc<Fence>>) -> Result<()> {
        self.wait_counted(&fences).during(call)
    }

    /// Waits for `fences` on the host, counted as eviction waits.
    fn wait_counted(&mut self, fences: &[Arc<Fence>]) -> Result<(), DeviceError> {
        let started = std::time::Instant::now();
        let waited = fences.iter().try_for_each(|fence| fence.wait());
        self.counters.evict_wait_ms += started.elapsed().as_secs_f64() * 1e3;
        waited
    }
}
