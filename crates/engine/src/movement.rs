//! Moving chunks between HBM and the host tier.
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
//! chunk coming back to the same physical chunk needs no mapping either (chunk.rs says why).
//!
//! **A driver fact that shapes the schedule** (H200, driver 580): `cuMemMap`/`cuMemSetAccess`
//! wait for copies *to the host* that are in flight — during a 1 GiB copy down, mapping 16
//! chunks took 17 ms instead of 0.35 ms — while copies up and `cuMemUnmap` delay nothing. So
//! mapping overlaps copies up but never copies down: `exchange` maps its incoming chunks before
//! it issues its outgoing copies, and evictions finish their copies before the freed chunks
//! are mapped again.
//!
//! **Room** (`make_room`): when a demand needs more HBM than the pool has, the policy picks
//! victims among chunks that are resident, not acquired, not protected (the chunks being
//! acquired), and whose fences have completed — or, with a schedule, Belady's choice among all
//! of them, waited for if still in use. This and a page-in ahead of the schedule (which waits
//! for its victims to pace the caller to the GPU) are the places the host waits. Streams: `up` for demand, `prefetch` (low priority) for prefetches,
//! `down` for page-outs, so the two directions overlap on the two copy engines.

use crate::chunk::ChunkState;
use crate::engine::{ChunkRef, Inner, PendingDown};
use crate::error::Context;
use crate::fence::{after_all, settled, Fence};
use crate::host_tier::Slot;
use crate::BufferId;
use crate::{Error, Result};
use std::sync::Arc;
use tiermem_mechanism::file_store::FileSlot;
use tiermem_mechanism::{DeviceError, DevicePtr, HostPtr, PhysHandle, StreamHandle};
use tiermem_policy::{new_policy, Candidate, PolicyKind};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// Needed now: may evict.
    Demand,
    /// Wanted soon: only free HBM, on the low-priority stream.
    Prefetch,
    /// Needed `horizon` steps from now by the schedule: on the low-priority stream, evicting
    /// only chunks whose next use is further away.
    Ahead { horizon: u64 },
}

impl Inner {
    /// Makes `wanted` (sorted) resident, or as many as free HBM allows for a prefetch.
    /// Returns the fences after which every chunk brought in has arrived (none if nothing moved).
    pub fn bring_in(&mut self, call: &'static str, wanted: &[ChunkRef], purpose: Purpose) -> Result<Vec<Arc<Fence>>> {
        debug_assert!(wanted.windows(2).all(|w| w[0] < w[1]), "chunk lists are sorted");
        let mut todo = Vec::new();
        for &r in wanted {
            let chunk = self.chunk_mut(r);
            match std::mem::replace(&mut chunk.state, ChunkState::Empty) {
                // Still in HBM: cancel the move. Its slot holds (or will, once the fence is done)
                // an identical copy, so it stays clean; users wait for the copy before writing.
                ChunkState::PagingOut { phys, slot, fence } => {
                    chunk.state = ChunkState::Device { phys, copy: slot };
                    chunk.ready = Some(fence);
                }
                state @ (ChunkState::Empty | ChunkState::Host { .. } | ChunkState::File) => {
                    chunk.state = state;
                    todo.push(r);
                }
                state @ ChunkState::Device { .. } => chunk.state = state,
            }
        }
        if todo.is_empty() {
            return Ok(Vec::new());
        }
        match (purpose, self.schedule.is_some()) {
            (Purpose::Demand, true) => self.send_holders_home(call, &todo, wanted, 0)?,
            (Purpose::Ahead { horizon }, true) => self.send_holders_home(call, &todo, wanted, horizon)?,
            _ => {}
        }
        match purpose {
            Purpose::Demand => self.make_room(call, todo.len(), wanted)?,
            Purpose::Prefetch => {}
            Purpose::Ahead { horizon } => {
                while self.pool.available() < todo.len() {
                    let short = todo.len() - self.pool.available();
                    if !self.evict_beyond(call, short, wanted, horizon)? {
                        break;
                    }
                }
            }
        }
        let mut phys = self.take_phys(call, &todo)?;
        // The driver may give fewer chunks than the cap promised (the cap then shrinks): a demand
        // evicts for the rest.
        while purpose == Purpose::Demand && phys.len() < todo.len() {
            if let Err(e) = self.make_room(call, todo.len() - phys.len(), wanted) {
                phys.into_iter().for_each(|p| self.pool.give(p));
                return Err(e);
            }
            let more = self.take_phys(call, &todo[phys.len()..])?;
            phys.extend(more);
        }
        todo.truncate(phys.len());
        if todo.is_empty() {
            return Ok(Vec::new());
        }
        let stream = match purpose {
            Purpose::Demand => self.streams.up,
            Purpose::Prefetch | Purpose::Ahead { .. } => self.streams.prefetch,
        };
        let start = match purpose {
            Purpose::Demand => Some(self.events.record(stream).during(call)?),
            Purpose::Prefetch | Purpose::Ahead { .. } => None,
        };
        // Chunks coming from the file are read in the background (file_reads.rs), a group at a
        // time, each behind a fence of its own; those fences are made first, so that nothing
        // is mapped unless every read can be queued.
        let group = crate::file_reads::GROUP_BATCHES * self.batch;
        let from_file = todo.iter().filter(|&&r| matches!(self.chunk_mut(r).state, ChunkState::File)).count();
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
        for batch in batches(&todo, self.batch) {
            let batch_phys: Vec<PhysHandle> = phys.by_ref().take(batch.len()).collect();
            let file_chunks: Vec<(ChunkRef, Option<FileSlot>)> = batch
                .iter()
                .filter_map(|&r| {
                    let chunk = self.chunk_mut(r);
                    matches!(chunk.state, ChunkState::File).then_some((r, chunk.file))
                })
                .collect();
            if let Err(e) = self.copy_up(batch, &batch_phys, stream) {
                failure = Some(Error::Device { call, source: e });
                break;
            }
            landed.extend(batch.iter().copied().filter(|r| !file_chunks.iter().any(|(f, _)| f == r)));
            read += file_chunks.len();
            reads.extend(file_chunks);
            while reads.len() >= group {
                let rest = reads.split_off(group);
                fences.push(self.queue_read(call, std::mem::replace(&mut reads, rest), &mut read_fences));
            }
        }
        if !reads.is_empty() {
            fences.push(self.queue_read(call, reads, &mut read_fences));
        }
        phys.for_each(|p| self.pool.give(p));
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
            self.chunk_mut(r).ready = Some(Arc::clone(&fence));
        }
        if let Some(start) = start {
            self.timings.push_back((start, Arc::clone(&fence)));
        }
        fences.push(fence);
        failure.map_or(Ok(fences), Err)
    }

    /// Hands `reads` (chunks just mapped, whose bytes are only in the file) to the background
    /// reader behind the next of `fences`, which becomes their `ready` fence. Returns it.
    fn queue_read(
        &mut self,
        call: &'static str,
        reads: Vec<(ChunkRef, Option<FileSlot>)>,
        fences: &mut impl Iterator<Item = Arc<Fence>>,
    ) -> Arc<Fence> {
        let fence = fences.next().expect("one fence was made per group");
        let mut items = Vec::with_capacity(reads.len());
        for (r, file) in reads {
            items.push((file.expect("a File chunk has a file slot"), self.chunk_va(r)));
            self.chunk_mut(r).ready = Some(Arc::clone(&fence));
        }
        self.counters.file_reads += items.len() as u64;
        let tier = self.file.as_ref().expect("File chunks exist only with a file tier");
        tier.reader.submit(crate::file_reads::ReadGroup { call, items, fence: Arc::clone(&fence) });
        fence
    }

    /// Physical chunks for `todo`, one each, for as many of its first chunks as the pool can
    /// serve: a chunk whose stale mapping points at an idle physical chunk takes that one (it
    /// needs no driver call), the others whatever is idle or can still be created.
    fn take_phys(&mut self, call: &'static str, todo: &[ChunkRef]) -> Result<Vec<PhysHandle>> {
        let aliases: Vec<Option<PhysHandle>> = todo.iter().map(|&r| self.chunk_mut(r).alias).collect();
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

    /// Maps one batch of consecutive chunks of one buffer and enqueues their copies up: from
    /// their host slots, or zeros. Chunks whose bytes are in the file are only mapped: the
    /// caller queues their reads. On failure every chunk of the batch is as before and its
    /// physical chunks are back in the pool.
    fn copy_up(&mut self, batch: &[ChunkRef], phys: &[PhysHandle], stream: StreamHandle) -> Result<(), DeviceError> {
        let g = self.chunk;
        let va0 = self.chunk_va(batch[0]);
        let device = Arc::clone(&self.device);
        // Chunks still mapped at their physical chunk need nothing; a stale mapping elsewhere
        // is unmapped first.
        let mut fresh = Vec::new();
        let mut outcome = Ok(());
        for (i, (&r, &p)) in batch.iter().zip(phys).enumerate() {
            let va = va0 + (i * g) as u64;
            let chunk = self.chunk_mut(r);
            let alias = chunk.alias;
            if alias == Some(p) && !chunk.alias_lacks_access {
                continue;
            }
            if alias.is_some() {
                let started = std::time::Instant::now();
                outcome = device.unmap(va, g);
                self.counters.unmap_ms += started.elapsed().as_secs_f64() * 1e3;
                if outcome.is_err() {
                    break;
                }
                let chunk = self.chunk_mut(r);
                (chunk.alias, chunk.alias_lacks_access) = (None, false);
            }
            let started = std::time::Instant::now();
            outcome = device.map(va, p);
            self.counters.map_ms += started.elapsed().as_secs_f64() * 1e3;
            if outcome.is_err() {
                break;
            }
            fresh.push((r, p, va));
            self.counters.maps += 1;
        }
        if outcome.is_ok() && !fresh.is_empty() {
            let started = std::time::Instant::now();
            outcome = device.set_access(va0, batch.len() * g);
            self.counters.map_ms += started.elapsed().as_secs_f64() * 1e3;
        }
        if outcome.is_ok() {
            let sources: Vec<Source> = batch
                .iter()
                .map(|&r| match self.chunk_mut(r).state {
                    ChunkState::Host { slot } => Source::Host(self.host.addr(slot)),
                    ChunkState::File => Source::File,
                    _ => Source::Zeros,
                })
                .collect();
            for (k, n, source) in coalesce(&sources, g) {
                let dst = va0 + (k * g) as u64;
                outcome = match source {
                    // SAFETY: the slots are pinned memory owned by these chunks, freed only
                    // after this copy's fence.
                    Source::Host(src) => unsafe { device.copy_to_device_async(dst, src, n * g, stream) },
                    Source::Zeros => device.memset_async(dst, 0, n * g, stream),
                    Source::File => Ok(()),
                };
                if outcome.is_err() {
                    // Copies already enqueued must not land in chunks handed to someone else.
                    let _ = device.synchronize_stream(stream);
                    break;
                }
            }
        }
        if let Err(e) = outcome {
            // An unmap that fails here leaves a mapping without access (if `cuMemSetAccess`
            // failed): recorded as a stale mapping to unmap before the next map, and by `free`.
            // (Unrecorded, it made freeing the buffer fail for ever.)
            for (r, p, va) in fresh {
                if device.unmap(va, g).is_err() {
                    let chunk = self.chunk_mut(r);
                    (chunk.alias, chunk.alias_lacks_access) = (Some(p), true);
                }
            }
            phys.iter().for_each(|&p| self.pool.give(p));
            return Err(e);
        }
        for (&r, &p) in batch.iter().zip(phys) {
            let chunk = self.chunk_mut(r);
            let (copy, copied) = match chunk.state {
                ChunkState::Host { slot } => (Some(slot), true),
                ChunkState::File => (None, true),
                _ => (None, false),
            };
            chunk.state = ChunkState::Device { phys: p, copy };
            chunk.alias = None;
            self.holders.insert(p, r);
            self.buffers.get_mut(&r.0).expect("chunk of a live buffer").mapped += 1;
            match copied {
                true => self.counters.page_ins += 1,
                false => self.counters.zero_fills += 1,
            }
        }
        Ok(())
    }

    pub fn chunk_va(&self, (id, index): ChunkRef) -> DevicePtr {
        self.buffers[&id].va + (index * self.chunk) as u64
    }

    /// Moves resident, unacquired chunks (sorted) out of HBM. Returns the fences after which
    /// every chunk that did not leave at once will have left (copies down, or last uses).
    pub fn send_down(&mut self, call: &'static str, refs: &[ChunkRef]) -> Result<Vec<Arc<Fence>>> {
        let mut fences: Vec<Arc<Fence>> = Vec::new();
        let mut drop_now = Vec::new();
        let mut dirty = Vec::new();
        for &r in refs {
            let chunk = self.chunk_mut(r);
            let ChunkState::Device { phys, copy } = chunk.state else { continue };
            // Clean: an identical copy is in the host tier (`Some(slot)`) or only in the file (`None`).
            let clean = match (copy, chunk.file) {
                (Some(slot), _) => Some(Some(slot)),
                (None, Some(_)) => Some(None),
                (None, None) => None,
            };
            match clean {
                None => dirty.push(r),
                Some(slot) => {
                    // It may leave only after both its last use and the copy that filled its
                    // slot or its HBM (cancelled page-outs leave that copy in flight): the
                    // first of them done proves nothing of the other.
                    let in_flight: Vec<Arc<Fence>> =
                        [&chunk.busy, &chunk.ready].into_iter().flatten().cloned().collect();
                    let unsettled = after_all(&self.events, self.streams.down, &in_flight).during(call)?;
                    let chunk = self.chunk_mut(r);
                    match unsettled {
                        None => drop_now.push((r, phys, slot)),
                        Some(fence) => {
                            chunk.state = ChunkState::PagingOut { phys, slot, fence: Arc::clone(&fence) };
                            if !fences.iter().any(|f| Arc::ptr_eq(f, &fence)) {
                                fences.push(Arc::clone(&fence));
                            }
                            self.pending_down.push(PendingDown { fence, chunks: vec![r] });
                            self.counters.clean_drops += 1;
                        }
                    }
                }
            }
        }
        self.counters.clean_drops += drop_now.len() as u64;
        self.detach_chunks(&drop_now);
        let room = self.host.cap();
        if dirty.len() <= room || self.file.is_none() {
            fences.extend(self.copy_dirty_down(call, &dirty)?);
            return Ok(fences);
        }
        // More than the host tier can ever hold at once: go down in rounds that fit, each
        // waited for, so that the next round can spill the one before it to the file.
        for round in dirty.chunks(room) {
            let round_fences = self.copy_dirty_down(call, round)?;
            for fence in &round_fences {
                fence.wait().during(call)?;
            }
            self.reap()?;
            fences.extend(round_fences);
        }
        Ok(fences)
    }

    /// Copies dirty resident chunks (sorted) down into host slots; returns one fence per batch.
    fn copy_dirty_down(&mut self, call: &'static str, dirty: &[ChunkRef]) -> Result<Vec<Arc<Fence>>> {
        let slots = self.host_slots(call, dirty)?;
        let mut fences = Vec::new();
        let down = self.streams.down;
        let mut awaited: Vec<Arc<Fence>> = Vec::new();
        for &r in dirty {
            let chunk = self.chunk_mut(r);
            for fence in [&chunk.busy, &chunk.ready].into_iter().flatten() {
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
            if let Err(e) = self.copy_down(batch, batch_slots, down) {
                slots[next_slot..].iter().for_each(|&s| self.host.free(s));
                return Err(Error::Device { call, source: e });
            }
            next_slot += batch.len();
            let fence = self.events.record(down).during(call)?;
            for (&r, &slot) in batch.iter().zip(batch_slots) {
                let chunk = self.chunk_mut(r);
                let ChunkState::Device { phys, .. } = chunk.state else { unreachable!("dirty chunks are resident") };
                chunk.state = ChunkState::PagingOut { phys, slot: Some(slot), fence: Arc::clone(&fence) };
            }
            self.counters.page_outs += batch.len() as u64;
            self.pending_down.push(PendingDown { fence: Arc::clone(&fence), chunks: batch.to_vec() });
            fences.push(fence);
        }
        Ok(fences)
    }

    /// Enqueues the copies of one batch of consecutive chunks into `slots`.
    fn copy_down(&mut self, batch: &[ChunkRef], slots: &[Slot], stream: StreamHandle) -> Result<(), DeviceError> {
        let g = self.chunk;
        let va0 = self.chunk_va(batch[0]);
        let targets: Vec<Source> = slots.iter().map(|&s| Source::Host(self.host.addr(s))).collect();
        for (k, n, dst) in coalesce(&targets, g) {
            let Source::Host(dst) = dst else { unreachable!("every chunk has a slot") };
            // SAFETY: the slots were just allocated for these chunks and nothing else uses them;
            // the chunks stay mapped (PagingOut) until this copy's fence has completed.
            let copied = unsafe { self.device.copy_to_host_async(dst, va0 + (k * g) as u64, n * g, stream) };
            if let Err(e) = copied {
                let _ = self.device.synchronize_stream(stream);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Host slots for `dirty`. When the tier is full: give up clean copies of resident chunks,
    /// spill cold chunks to the file tier, and wait for slots that copies still read.
    fn host_slots(&mut self, call: &'static str, dirty: &[ChunkRef]) -> Result<Vec<Slot>> {
        let n = dirty.len();
        loop {
            if let Some(slots) = self.host.alloc(self.device.as_ref(), n).during(call)? {
                return Ok(slots);
            }
            self.reclaim_host_copies(n);
            if let Some(slots) = self.host.alloc(self.device.as_ref(), n).during(call)? {
                return Ok(slots);
            }
            let spilled = self.spill_to_file(call, n)?;
            if let Some(slots) = self.host.alloc(self.device.as_ref(), n).during(call)? {
                return Ok(slots);
            }
            match self.next_host_release() {
                Some(fence) => {
                    fence.wait().during(call)?;
                    self.reap()?;
                }
                None if spilled => {}
                // Slots spilled while a background write still reads them come back once it is done.
                None if self.host.has_freed_while_held() && self.complete_a_file_write() => {}
                None => {
                    // A copy up may have completed since `reclaim_host_copies` looked, freeing
                    // its copy for reclaiming: one more try before giving up.
                    self.reclaim_host_copies(n);
                    if let Some(slots) = self.host.alloc(self.device.as_ref(), n).during(call)? {
                        return Ok(slots);
                    }
                    return Err(Error::OutOfMemory {
                        call,
                        detail: format!(
                            "{n} chunks must be copied to the host tier, which is full ({}); {}",
                            self.host_holders(),
                            self.describe_tiers()
                        ),
                    });
                }
            }
        }
    }

    /// The fence whose completion will next let a host slot be freed or spilled: a slot a copy
    /// still reads, a chunk still being copied down, a clean copy a copy up still reads.
    fn next_host_release(&self) -> Option<Arc<Fence>> {
        if let Some((fence, _)) = self.retiring.front() {
            return Some(Arc::clone(fence));
        }
        if let Some(group) = self.pending_down.first() {
            return Some(Arc::clone(&group.fence));
        }
        self.buffers.values().flat_map(|b| &b.chunks).find_map(|chunk| match (&chunk.state, &chunk.ready) {
            (ChunkState::Device { copy: Some(_), .. }, Some(ready)) if !matches!(ready.is_done(), Ok(true)) => {
                Some(Arc::clone(ready))
            }
            _ => None,
        })
    }

    /// Who holds the host tier's slots, for an out-of-memory message.
    fn host_holders(&self) -> String {
        let (mut data, mut copies, mut moving) = (0, 0, 0);
        for chunk in self.buffers.values().flat_map(|b| &b.chunks) {
            match chunk.state {
                ChunkState::Host { .. } => data += 1,
                ChunkState::Device { copy: Some(_), .. } => copies += 1,
                ChunkState::PagingOut { slot: Some(_), .. } => moving += 1,
                _ => {}
            }
        }
        format!(
            "held by {data} chunks' data, {copies} copies of resident chunks, {moving} chunks moving down, {} slots \
             still read by copies, {} slots let go but still read by file writes",
            self.retiring.len(),
            self.host.freed_while_held_count()
        )
    }

    /// Frees up to `wanted` host slots that only held copies of chunks still resident in HBM.
    fn reclaim_host_copies(&mut self, wanted: usize) {
        let mut freed = Vec::new();
        'outer: for buffer in self.buffers.values_mut() {
            for chunk in &mut buffer.chunks {
                if freed.len() == wanted {
                    break 'outer;
                }
                if let ChunkState::Device { copy, .. } = &mut chunk.state {
                    if copy.is_some() && matches!(settled(&chunk.ready), Ok(true)) {
                        freed.extend(copy.take());
                    }
                }
            }
        }
        freed.into_iter().for_each(|s| self.host.free(s));
    }

    /// Chunks leave HBM: their physical chunks go back to the pool, and they become `Host` where
    /// their data is safe in a slot, `File` where the file holds it. Their mappings stay, stale
    /// (`alias`): no driver call. Nothing may still use them (their fences have completed).
    pub fn detach_chunks(&mut self, items: &[(ChunkRef, PhysHandle, Option<Slot>)]) {
        let mut items = items.to_vec();
        items.sort_unstable_by_key(|&(r, _, _)| r);
        // A chunk sent down, brought back and sent down again behind the same fence sits in two
        // landed groups: detach it once.
        items.dedup_by_key(|&mut (r, _, _)| r);
        for (r, phys, slot) in items {
            self.leave_hbm(r, phys, slot);
            self.chunk_mut(r).alias = Some(phys);
        }
    }

    /// The bookkeeping of a chunk leaving HBM (its mapping is the caller's business).
    fn leave_hbm(&mut self, r: ChunkRef, phys: PhysHandle, slot: Option<Slot>) {
        self.pool.give(phys);
        self.holders.remove(&phys);
        self.buffers.get_mut(&r.0).expect("chunk of a live buffer").mapped -= 1;
        let chunk = self.chunk_mut(r);
        chunk.state = match (slot, chunk.file) {
            (Some(slot), _) => ChunkState::Host { slot },
            (None, Some(_)) => ChunkState::File,
            (None, None) => ChunkState::Empty,
        };
        (chunk.ready, chunk.busy) = (None, None);
    }

    /// Unmaps a buffer's chunks for `free`: resident ones leave HBM (`Empty` unless a slot or the
    /// file holds their data), stale mappings go. Each chunk is marked as soon as it is
    /// unmapped, so after a failure a retry unmaps only what is still mapped.
    pub fn unmap_buffer(&mut self, id: BufferId) -> Result<(), DeviceError> {
        for index in 0..self.buffers[&id].chunks.len() {
            let r = (id, index);
            let va = self.chunk_va(r);
            let chunk = self.chunk_mut(r);
            let resident = match chunk.state {
                ChunkState::Device { phys, copy } => Some((phys, copy)),
                ChunkState::PagingOut { phys, slot, .. } => Some((phys, slot)),
                ChunkState::Empty | ChunkState::Host { .. } | ChunkState::File => None,
            };
            if resident.is_none() && chunk.alias.is_none() {
                continue;
            }
            let started = std::time::Instant::now();
            self.device.unmap(va, self.chunk)?;
            self.counters.unmap_ms += started.elapsed().as_secs_f64() * 1e3;
            let chunk = self.chunk_mut(r);
            (chunk.alias, chunk.alias_lacks_access) = (None, false);
            if let Some((phys, slot)) = resident {
                self.leave_hbm(r, phys, slot);
            }
        }
        Ok(())
    }

    /// Completes whatever has finished: chunks whose copy down landed leave HBM, host slots
    /// whose readers are done are freed, demand-copy timings are added up. Never blocks.
    pub fn reap(&mut self) -> Result<()> {
        let mut landed = Vec::new();
        let mut i = 0;
        while i < self.pending_down.len() {
            if self.pending_down[i].fence.is_done().during("reap")? {
                landed.push(self.pending_down.swap_remove(i));
            } else {
                i += 1;
            }
        }
        let mut items = Vec::new();
        for group in &landed {
            for &r in &group.chunks {
                let Some(buffer) = self.buffers.get(&r.0) else { continue };
                if let ChunkState::PagingOut { phys, slot, fence } = &buffer.chunks[r.1].state {
                    if Arc::ptr_eq(fence, &group.fence) {
                        items.push((r, *phys, *slot));
                    }
                }
            }
        }
        self.detach_chunks(&items);
        while let Some((fence, _)) = self.retiring.front() {
            if !fence.is_done().during("reap")? {
                break;
            }
            let (_, slot) = self.retiring.pop_front().expect("checked");
            self.host.free(slot);
        }
        // Chunks beyond a budget that shrank go back to the driver as they become idle.
        if self.pool.releasable(self.pool.cap()) > 0 {
            self.release_idle_beyond("reap", self.pool.cap())?;
        }
        while let Some((start, end)) = self.timings.front() {
            if !end.is_done().during("reap")? {
                break;
            }
            self.counters.stall_ms += f64::from(end.elapsed_since(start).during("reap")?);
            self.timings.pop_front();
        }
        Ok(())
    }

    /// Frees HBM until `need` chunks can be taken from the pool, evicting by policy.
    fn make_room(&mut self, call: &'static str, need: usize, protect: &[ChunkRef]) -> Result<()> {
        loop {
            self.reap()?;
            let available = self.pool.available();
            if available >= need {
                return Ok(());
            }
            let short = need - available;
            if self.evict(call, short, protect, None)? {
                continue;
            }
            match self.next_settling(protect) {
                Settling::Wait(fence) => fence.wait().during(call)?,
                Settling::Now => {}
                Settling::Never => {
                    return Err(Error::OutOfMemory {
                        call,
                        detail: format!(
                        "{} more bytes of HBM are needed and every resident chunk is acquired or being acquired; {}",
                        short * self.chunk,
                        self.describe_tiers()
                    ),
                    })
                }
            }
        }
    }

    /// For a page-in ahead of the schedule: evicts up to `need` chunks whose next use is
    /// further than `horizon` steps away, and waits until they have left. In a loop the victim
    /// is usually the chunk just released, still read by work the GPU has queued; waiting for
    /// it paces the caller to the GPU while the copies already enqueued keep the link busy
    /// (stopping instead lets the caller run ahead, and every later chunk becomes a demand).
    /// `false` if nothing may leave.
    fn evict_beyond(&mut self, call: &'static str, need: usize, protect: &[ChunkRef], horizon: u64) -> Result<bool> {
        self.reap()?;
        self.evict(call, need, protect, Some(horizon))
    }

    /// Evicts up to `count` chunks that may leave (next used beyond `horizon`, if given), chosen
    /// by the policy (Belady while a schedule is set), and waits until they have left.
    /// `false` if there was nothing to evict.
    fn evict(&mut self, call: &'static str, count: usize, protect: &[ChunkRef], horizon: Option<u64>) -> Result<bool> {
        let (refs, candidates) = self.candidates(protect, horizon, count).during(call)?;
        if candidates.is_empty() {
            return Ok(false);
        }
        let mut victims: Vec<ChunkRef> = self.select_victims(&candidates, count).into_iter().map(|i| refs[i]).collect();
        victims.sort_unstable();
        self.evict_now(call, &victims)?;
        Ok(true)
    }

    /// Sends `victims` (sorted) down and waits until they have left. With a schedule they are
    /// marked as streamed (homes.rs).
    pub(crate) fn evict_now(&mut self, call: &'static str, victims: &[ChunkRef]) -> Result<()> {
        self.counters.evictions += victims.len() as u64;
        if self.schedule.is_some() {
            victims.iter().for_each(|&r| self.chunk_mut(r).streamed = true);
        }
        let fences = self.send_down(call, victims)?;
        let started = std::time::Instant::now();
        for fence in fences {
            fence.wait().during(call)?;
        }
        self.counters.evict_wait_ms += started.elapsed().as_secs_f64() * 1e3;
        self.reap()
    }

    /// The policy's choice among `candidates`; Belady's while a schedule is set.
    pub fn select_victims(&mut self, candidates: &[Candidate], count: usize) -> Vec<usize> {
        match self.schedule {
            Some(_) => new_policy(PolicyKind::Belady, 0).select_victims(candidates, count),
            None => self.policy.select_victims(candidates, count),
        }
    }

    /// Chunks that may be evicted, with their metadata: resident, not acquired, not protected,
    /// and next used beyond `horizon` steps (if given). Without a schedule only chunks whose
    /// fences have completed are offered (the policy prefers what can leave at once); with one,
    /// every chunk is, because Belady's order matters more than a wait: in a loop the chunk
    /// just released is the one needed furthest away, and passing it over for an idle one
    /// would evict a chunk that stays resident for the whole pass.
    ///
    /// With a schedule, every chunk of a buffer has the buffer's next use, so buffers are
    /// visited in Belady's order and only as many as give `count` chunks are offered (whole
    /// groups of equal next use, so the policy still breaks ties among all of them): an
    /// eviction looks at a few buffers, not at every chunk in HBM.
    pub(crate) fn candidates(
        &self,
        protect: &[ChunkRef],
        horizon: Option<u64>,
        count: usize,
    ) -> Result<(Vec<ChunkRef>, Vec<Candidate>), DeviceError> {
        let mut order: Vec<(Option<std::cmp::Reverse<u64>>, BufferId)> = Vec::new();
        for (&id, buffer) in &self.buffers {
            if buffer.mapped == 0 {
                continue;
            }
            let next_use = self.schedule.as_ref().and_then(|s| s.next_use(id));
            if let (Some(horizon), Some(next)) = (horizon, next_use) {
                if next <= horizon {
                    continue;
                }
            }
            order.push((next_use.map(std::cmp::Reverse), id));
        }
        if self.schedule.is_some() {
            order.sort_unstable();
        }
        let (mut refs, mut candidates) = (Vec::new(), Vec::new());
        let mut group = None;
        for (key, id) in order {
            if self.schedule.is_some() && candidates.len() >= count && group != Some(key) {
                break;
            }
            group = Some(key);
            let buffer = &self.buffers[&id];
            for (index, chunk) in buffer.chunks.iter().enumerate() {
                let ChunkState::Device { copy, .. } = chunk.state else { continue };
                if chunk.pins > 0 || protect.binary_search(&(id, index)).is_ok() {
                    continue;
                }
                if self.schedule.is_none() && (!settled(&chunk.ready)? || !settled(&chunk.busy)?) {
                    continue;
                }
                candidates.push(Candidate {
                    key: refs.len() as u64,
                    last_use: chunk.last_use,
                    clean: copy.is_some(),
                    priority: buffer.options.priority,
                    next_use: key.map(|r| r.0),
                });
                refs.push((id, index));
            }
        }
        Ok((refs, candidates))
    }

    /// What to wait for before HBM can be made free: the next copy down to land, or the work
    /// still running on a chunk that could then be evicted. `Now` if such a chunk has no work
    /// left: it finished since the candidates were listed (the GPU does not wait for the
    /// engine), so evicting again will find it.
    fn next_settling(&self, protect: &[ChunkRef]) -> Settling {
        if let Some(group) = self.pending_down.first() {
            return Settling::Wait(Arc::clone(&group.fence));
        }
        let mut settled = false;
        for (&id, buffer) in &self.buffers {
            for (index, chunk) in buffer.chunks.iter().enumerate() {
                if !chunk.is_resident() || chunk.pins > 0 || protect.binary_search(&(id, index)).is_ok() {
                    continue;
                }
                match [&chunk.busy, &chunk.ready].into_iter().flatten().find(|f| !matches!(f.is_done(), Ok(true))) {
                    Some(fence) => return Settling::Wait(Arc::clone(fence)),
                    None => settled = true,
                }
            }
        }
        if settled {
            Settling::Now
        } else {
            Settling::Never
        }
    }
}

/// See [`Inner::next_settling`].
enum Settling {
    Wait(Arc<Fence>),
    Now,
    Never,
}

/// Splits sorted chunk refs into batches of at most `max` consecutive chunks of one buffer.
pub(crate) fn batches(refs: &[ChunkRef], max: usize) -> impl Iterator<Item = &[ChunkRef]> {
    let mut rest = refs;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let n = (1..rest.len().min(max))
            .find(|&k| rest[k].0 != rest[0].0 || rest[k].1 != rest[0].1 + k)
            .unwrap_or(rest.len().min(max));
        let (batch, tail) = rest.split_at(n);
        rest = tail;
        Some(batch)
    })
}

/// Where a chunk coming up gets its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// A pinned host slot.
    Host(HostPtr),
    /// Never written: zeros.
    Zeros,
    /// The file: the background reader copies it (file_reads.rs).
    File,
}

/// Groups consecutive chunks into single transfers: runs of host slots at adjacent addresses,
/// runs of zero-fills, runs read from the file. Yields `(first, count, source of the first)`.
pub(crate) fn coalesce(sources: &[Source], chunk: usize) -> Vec<(usize, usize, Source)> {
    let mut out: Vec<(usize, usize, Source)> = Vec::new();
    for (k, &source) in sources.iter().enumerate() {
        if let Some((_, n, start)) = out.last_mut() {
            let extends = match (*start, source) {
                (Source::Host(s), Source::Host(a)) => a == s + *n * chunk,
                (Source::Host(_), _) | (_, Source::Host(_)) => false,
                (a, b) => a == b,
            };
            if extends {
                *n += 1;
                continue;
            }
        }
        out.push((k, 1, source));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BufferId;

    #[test]
    fn batches_split_at_buffer_gaps_and_size() {
        let (a, b) = (BufferId(1), BufferId(2));
        let refs = [(a, 0), (a, 1), (a, 2), (a, 4), (b, 0), (b, 1)];
        let got: Vec<&[ChunkRef]> = batches(&refs, 2).collect();
        assert_eq!(got, vec![&refs[0..2], &refs[2..3], &refs[3..4], &refs[4..6]]);
    }

    #[test]
    fn coalesce_joins_adjacent_slots_zero_runs_and_file_runs() {
        let g = 0x10;
        use Source::{File, Host, Zeros};
        let sources = [Host(0x100), Host(0x110), Host(0x200), Zeros, Zeros, Host(0x210), File, File, Zeros];
        assert_eq!(
            coalesce(&sources, g),
            vec![
                (0, 2, Host(0x100)),
                (2, 1, Host(0x200)),
                (3, 2, Zeros),
                (5, 1, Host(0x210)),
                (6, 2, File),
                (8, 1, Zeros)
            ]
        );
    }
}
