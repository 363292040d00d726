//! Residency: buffers come and go (`alloc`, `free`), regions are resolved to chunks, and
//! chunks are acquired (made resident and pinned, the user's stream made to wait for them),
//! released, prefetched and paged ahead along a schedule (`advance`).

use crate::buffer::{Access, AllocOptions, BufferId, Region};
use crate::engine::{retag, Inner};
use crate::error::Context;
use crate::fence::Fence;
use crate::host_tier::Slot;
use crate::state::{Buffer, ChunkRef};
use crate::sync::Arc;
use crate::{Error, Result};
use tiermem_mechanism::StreamHandle;

impl Inner {
    pub(crate) fn buffer(&self, call: &'static str, id: BufferId) -> Result<&Buffer> {
        self.state.buffer(id).ok_or(Error::UnknownBuffer { call, buffer: id })
    }

    pub(crate) fn alloc(&mut self, size: usize, options: AllocOptions) -> Result<(BufferId, u64)> {
        if size == 0 {
            return Err(Error::ZeroSize { call: "alloc" });
        }
        let file_cap = self.file.as_ref().map_or(0, |tier| tier.store.capacity_slots());
        let all_tiers = (self.pool.cap() + self.host.cap() + file_cap) * self.chunk;
        if size > all_tiers {
            return Err(Error::OutOfMemory {
                call: "alloc",
                detail: format!(
                    "{size} bytes exceed all tiers together ({all_tiers} bytes: {})",
                    self.describe_tiers()
                ),
            });
        }
        let reserved = size.next_multiple_of(self.chunk);
        let va = self.device.reserve(reserved).during("alloc")?;
        Ok((self.state.add_buffer(va, size, reserved, options), va))
    }

    pub(crate) fn free(&mut self, id: BufferId) -> Result<()> {
        let buffer = self.buffer("free", id)?;
        let pinned_chunks = buffer.chunks().iter().filter(|c| c.pins() > 0).count();
        if pinned_chunks > 0 {
            return Err(Error::Acquired { call: "free", buffer: id, pinned_chunks });
        }
        for chunk in buffer.chunks() {
            for fence in chunk.in_flight().chain(chunk.leaving()) {
                fence.wait().during("free")?;
            }
        }
        // Unmap first, with the buffer still here: if cuMemUnmap fails the buffer stays and a
        // retry unmaps only what is still mapped. Its data is being discarded.
        let (va, reserved) = (buffer.va, buffer.reserved);
        self.unmap_buffer(id).during("free")?;
        self.device.unreserve(va, reserved).during("free")?;
        let (slots, file_slots) = self.state.remove_buffer(id);
        if let Some(schedule) = self.schedule.as_mut() {
            schedule.forget(id);
        }
        slots.into_iter().for_each(|slot| self.host.free(slot));
        self.free_file_slots(&file_slots);
        Ok(())
    }

    /// The distinct chunks `regions` cover, sorted; validates every region first.
    fn resolve(&self, call: &'static str, regions: &[Region]) -> Result<Vec<ChunkRef>> {
        let mut refs = Vec::new();
        for region in regions {
            let buffer = self.buffer(call, region.buffer)?;
            let len = region.len.unwrap_or(buffer.size.saturating_sub(region.offset));
            let end = region.offset.checked_add(len).filter(|&end| end <= buffer.size);
            let Some(end) = end.filter(|_| len > 0 || region.len.is_none()) else {
                return Err(Error::OutOfRange {
                    call,
                    buffer: region.buffer,
                    offset: region.offset,
                    len,
                    size: buffer.size,
                });
            };
            if len == 0 {
                continue;
            }
            let (first, last) = (region.offset / self.chunk, (end - 1) / self.chunk);
            refs.extend((first..=last).map(|i| (region.buffer, i)));
        }
        if regions.len() > 1 {
            refs.sort_unstable();
            refs.dedup();
        }
        Ok(refs)
    }

    pub(crate) fn acquire(&mut self, regions: &[Region], access: Access, stream: StreamHandle) -> Result<()> {
        let refs = self.resolve("acquire", regions)?;
        if access == Access::ReadWrite {
            if let Some(r) =
                regions.iter().find(|r| self.buffer("acquire", r.buffer).is_ok_and(|b| b.options.read_only))
            {
                return Err(Error::ReadOnly { call: "acquire", buffer: r.buffer });
            }
        }
        self.check_fits("acquire", &refs)?;
        if refs.iter().any(|&r| !self.state.chunk(r).is_resident()) {
            self.reap()?;
            self.bring_in("acquire", &refs, crate::movement::Purpose::Demand)?;
        }
        self.pin("acquire", &refs, access, stream)
    }

    /// `acquire` for a synchronous host copy: returns the buffer's address.
    pub(crate) fn acquire_for_host(
        &mut self,
        regions: &[Region],
        access: Access,
        stream: StreamHandle,
        call: &'static str,
    ) -> Result<u64> {
        let refs = self.resolve(call, regions)?;
        self.check_fits(call, &refs)?;
        self.reap()?;
        self.bring_in(call, &refs, crate::movement::Purpose::Demand)?;
        self.pin(call, &refs, access, stream)?;
        Ok(self.state.va((regions[0].buffer, 0)))
    }

    /// Refuses `chunks` chunks that could never be resident at once, whatever is evicted.
    pub(crate) fn check_cap(&self, call: &'static str, chunks: usize) -> Result<()> {
        let cap = self.pool.cap();
        if chunks > cap {
            return Err(Error::WouldNeverFit { call, requested: chunks * self.chunk, cap: cap * self.chunk });
        }
        Ok(())
    }

    /// Refuses an acquire that could never be resident, or not while others hold their pins.
    fn check_fits(&mut self, call: &'static str, refs: &[ChunkRef]) -> Result<()> {
        self.check_cap(call, refs.len())?;
        let already = refs.iter().filter(|&&r| self.state.chunk(r).pins() > 0).count();
        let pinned = self.state.pinned();
        if pinned - already + refs.len() > self.pool.cap() {
            return Err(Error::OutOfMemory {
                call,
                detail: format!(
                    "{} bytes requested while {} bytes are acquired by others; {}",
                    refs.len() * self.chunk,
                    (pinned - already) * self.chunk,
                    self.describe_tiers()
                ),
            });
        }
        Ok(())
    }

    /// Pins resident chunks and makes `stream` wait for those still arriving. Refused, pinning
    /// nothing, if a read from the file for any of them failed.
    fn pin(&mut self, call: &'static str, refs: &[ChunkRef], access: Access, stream: StreamHandle) -> Result<()> {
        if let Some(failure) = self.undo_failed_reads(refs) {
            return Err(retag(failure, call));
        }
        let mut waits: Vec<Arc<Fence>> = Vec::new();
        for &r in refs {
            if let Some(fence) = self.state.chunk(r).ready() {
                if fence.is_done().during("acquire")? {
                    self.state.set_ready(r, None);
                } else if !waits.iter().any(|w| Arc::ptr_eq(w, fence)) {
                    waits.push(Arc::clone(fence));
                }
            }
        }
        for fence in &waits {
            self.device.stream_wait_event(stream, fence.event()).during("acquire")?;
        }
        self.state.pin_all(refs);
        if access == Access::ReadWrite {
            for &r in refs {
                let reader = self.state.chunk(r).ready().cloned();
                let (host, file) = self.state.drop_copies(r);
                if let Some(slot) = host {
                    self.retire(slot, reader);
                }
                // Its read from the file, if any, is done: `undo_failed_reads` waited for it.
                self.free_file_slots(file.as_slice());
            }
        }
        Ok(())
    }

    /// Sends back to `File` those of `refs` whose background read from the file failed: their
    /// bytes are still in the file, their HBM goes back to the pool. Waits for reads not yet
    /// done with the disk. Returns the first failure.
    pub(crate) fn undo_failed_reads(&mut self, refs: &[ChunkRef]) -> Option<Error> {
        let mut failure = None;
        let mut undo = Vec::new();
        for &r in refs {
            let chunk = self.state.chunk(r);
            let Some(Err(e)) = chunk.ready().map(|fence| fence.recorded()) else { continue };
            if chunk.is_resident() {
                undo.push(r);
            }
            failure.get_or_insert(e);
        }
        self.detach_chunks(&undo);
        failure
    }

    /// Frees a host slot now, or once `reader` (a copy from it) has completed.
    fn retire(&mut self, slot: Slot, reader: Option<Arc<Fence>>) {
        match reader {
            Some(fence) if !matches!(fence.is_done(), Ok(true)) => self.in_flight.retire(fence, slot),
            _ => self.host.free(slot),
        }
    }

    pub(crate) fn release(&mut self, regions: &[Region], stream: StreamHandle) -> Result<()> {
        let refs = self.resolve("release", regions)?;
        if let Some(&(buffer, index)) = refs.iter().find(|&&r| self.state.chunk(r).pins() == 0) {
            let (offset, len) = (index * self.chunk, self.chunk);
            return Err(Error::NotAcquired { buffer, offset, len });
        }
        let fence = self.events.record(stream).during("release")?;
        for &r in &refs {
            self.state.unpin(r, Arc::clone(&fence));
        }
        if self.over_budget() {
            // The budget shrank while these were acquired: they leave first (budget.rs). The
            // release itself is done: if they cannot leave now (the tiers below are full, or
            // the driver fails), they stay until a later call makes room.
            let _ = self.shed_excess("release", &refs);
        }
        Ok(())
    }

    pub(crate) fn prefetch(&mut self, regions: &[Region]) -> Result<()> {
        let refs = self.resolve("prefetch", regions)?;
        self.reap()?;
        self.bring_in("prefetch", &refs, crate::movement::Purpose::Prefetch)?;
        Ok(())
    }

    pub(crate) fn advance(&mut self, step: usize, budget: usize) -> Result<usize> {
        let call = "advance";
        let Some(schedule) = self.schedule.as_mut() else {
            return Err(Error::Schedule { call, detail: "no schedule is set (Engine::set_schedule)".into() });
        };
        if step >= schedule.len() {
            let detail = format!("step {step} is outside the schedule of {} steps", schedule.len());
            return Err(Error::Schedule { call, detail });
        }
        schedule.set_position(step);
        self.reap()?;
        // The window: the coming steps, nearest first, until their chunks (resident or not)
        // reach the budget; what is missing there is brought in.
        let mut plan: Vec<(u64, Vec<ChunkRef>)> = Vec::new();
        let mut window = 0;
        let schedule = self.schedule.as_ref().expect("checked above");
        'steps: for (distance, ids) in schedule.ahead() {
            let mut missing = Vec::new();
            for &id in ids {
                let buffer = self.state.buffer(id).expect("scheduled buffers are live");
                for (index, chunk) in buffer.chunks().iter().enumerate() {
                    window += self.chunk;
                    if window > budget {
                        plan.push((distance, missing));
                        break 'steps;
                    }
                    if !chunk.is_resident() {
                        missing.push((id, index));
                    }
                }
            }
            plan.push((distance, missing));
        }
        let mut started = 0;
        for (distance, mut refs) in plan {
            refs.sort_unstable();
            refs.dedup();
            if refs.is_empty() {
                continue;
            }
            self.bring_in(call, &refs, crate::movement::Purpose::Ahead { horizon: distance })?;
            let landed = refs.iter().filter(|&&r| self.state.chunk(r).is_resident()).count();
            started += landed * self.chunk;
            if landed < refs.len() {
                break; // No room without evicting something needed sooner.
            }
        }
        Ok(started)
    }
}
