//! Moving chunks down: out of HBM into host slots, and the bookkeeping of chunks that have
//! left (`reap`, `detach_chunks`, `unmap_buffer`). movement.rs says how a copy down is
//! ordered; host_slots says what a page-out does when the host tier is full.

use crate::engine::Inner;
use crate::error::Context;
use crate::fence::{after_all, settled, Fence};
use crate::host_tier::Slot;
use crate::runs::{batches, coalesce, Source};
use crate::state::ChunkRef;
use crate::state::Location;
use crate::BufferId;
use crate::{Error, Result};
use std::sync::Arc;
use tiermem_mechanism::{DeviceError, StreamHandle};

impl Inner {
    /// Moves resident, unacquired chunks (sorted) out of HBM. Returns the fences after which
    /// every chunk that did not leave at once will have left (copies down, or last uses).
    pub fn send_down(&mut self, call: &'static str, refs: &[ChunkRef]) -> Result<Vec<Arc<Fence>>> {
        let mut fences: Vec<Arc<Fence>> = Vec::new();
        let mut drop_now = Vec::new();
        let mut dirty = Vec::new();
        for &r in refs {
            let chunk = self.state.chunk(r);
            if !chunk.is_resident() {
                continue;
            }
            match chunk.is_clean() {
                false => dirty.push(r),
                true => {
                    // It may leave only after both its last use and the copy that filled its
                    // slot or its HBM (cancelled page-outs leave that copy in flight): the
                    // first of them done proves nothing of the other.
                    let in_flight: Vec<Arc<Fence>> = chunk.in_flight().cloned().collect();
                    let unsettled = after_all(&self.events, self.streams.down, &in_flight).during(call)?;
                    match unsettled {
                        None => drop_now.push(r),
                        Some(fence) => {
                            self.state.start_leaving(r, Arc::clone(&fence), None);
                            if !fences.iter().any(|f| Arc::ptr_eq(f, &fence)) {
                                fences.push(Arc::clone(&fence));
                            }
                            self.in_flight.moving_down(fence, vec![r]);
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
            for fence in self.state.chunk(r).in_flight() {
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
                self.state.start_leaving(r, Arc::clone(&fence), Some(slot));
            }
            self.counters.page_outs += batch.len() as u64;
            self.in_flight.moving_down(Arc::clone(&fence), batch.to_vec());
            fences.push(fence);
        }
        Ok(fences)
    }

    /// Enqueues the copies of one batch of consecutive chunks into `slots`.
    fn copy_down(&mut self, batch: &[ChunkRef], slots: &[Slot], stream: StreamHandle) -> Result<(), DeviceError> {
        let g = self.chunk;
        let va0 = self.state.va(batch[0]);
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
                    self.wait_for(call, vec![fence])?;
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
        if let Some(fence) = self.in_flight.next_retired().or(self.in_flight.next_landing()) {
            return Some(Arc::clone(fence));
        }
        self.state.chunks().find_map(|(_, chunk)| match chunk.ready() {
            Some(ready) if chunk.is_resident() && chunk.host().is_some() && !matches!(ready.is_done(), Ok(true)) => {
                Some(Arc::clone(ready))
            }
            _ => None,
        })
    }

    /// Who holds the host tier's slots, for an out-of-memory message.
    fn host_holders(&self) -> String {
        let (mut data, mut copies, mut moving) = (0, 0, 0);
        for (_, chunk) in self.state.chunks() {
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
    fn reclaim_host_copies(&mut self, wanted: usize) {
        let spare: Vec<ChunkRef> = self
            .state
            .chunks()
            .filter(|(_, c)| c.is_resident() && c.host().is_some() && matches!(settled(c.ready()), Ok(true)))
            .map(|(r, _)| r)
            .take(wanted)
            .collect();
        for r in spare {
            let slot = self.state.drop_host_copy(r).expect("a host copy");
            self.host.free(slot);
        }
    }

    /// Chunks leave HBM: their physical chunks go back to the pool, and their bytes are where
    /// their copies are (host or file). Their mappings stay, stale (`alias`): no driver call.
    /// Nothing may still use them (their fences have completed).
    pub fn detach_chunks(&mut self, refs: &[ChunkRef]) {
        let mut refs = refs.to_vec();
        refs.sort_unstable();
        // A chunk sent down, brought back and sent down again behind the same fence sits in two
        // landed groups: detach it once.
        refs.dedup();
        for r in refs {
            let phys = self.state.leave_hbm(r);
            self.pool.give(phys);
        }
    }

    /// Unmaps a buffer's chunks for `free`: resident ones leave HBM (`Empty` unless a slot or the
    /// file holds their data), stale mappings go. Each chunk is marked as soon as it is
    /// unmapped, so after a failure a retry unmaps only what is still mapped.
    pub fn unmap_buffer(&mut self, id: BufferId) -> Result<(), DeviceError> {
        let chunks = self.state.buffer(id).expect("a live buffer").chunks().len();
        for index in 0..chunks {
            let r = (id, index);
            let chunk = self.state.chunk(r);
            let in_hbm = chunk.phys().is_some();
            if !in_hbm && chunk.alias().is_none() {
                continue;
            }
            let started = std::time::Instant::now();
            self.device.unmap(self.state.va(r), self.chunk)?;
            self.counters.unmap_ms += started.elapsed().as_secs_f64() * 1e3;
            if in_hbm {
                let phys = self.state.leave_hbm(r);
                self.pool.give(phys);
            }
            self.state.unmapped(r);
        }
        Ok(())
    }

    /// Completes whatever has finished: chunks whose copy down landed leave HBM, host slots
    /// whose readers are done are freed, demand-copy timings are added up. Never blocks.
    pub fn reap(&mut self) -> Result<()> {
        let landed = self.in_flight.landed().during("reap")?;
        let mut items = Vec::new();
        for group in &landed {
            for &r in &group.chunks {
                let Some(buffer) = self.state.buffer(r.0) else { continue };
                if buffer.chunks()[r.1].leaving().is_some_and(|fence| Arc::ptr_eq(fence, &group.fence)) {
                    items.push(r);
                }
            }
        }
        self.detach_chunks(&items);
        for slot in self.in_flight.retired().during("reap")? {
            self.host.free(slot);
        }
        // Chunks beyond a budget that shrank go back to the driver as they become idle.
        if self.pool.releasable(self.pool.cap()) > 0 {
            self.release_idle_beyond("reap", self.pool.cap())?;
        }
        self.counters.stall_ms += self.in_flight.timed_ms().during("reap")?;
        Ok(())
    }
}
