//! The engine's calls, planned under the lock: buffers come and go (`alloc`, `free`), regions
//! are resolved to chunks, and chunks are acquired (made resident and pinned, the user's stream
//! made to wait for them), released, prefetched and paged ahead along a schedule (`advance`);
//! whole buffers move behind tickets (`page_in_start`, `page_out_start`, `exchange_start`,
//! `page_out_to_file_start`; `Engine::finish` waits for them); the HBM budget changes; the
//! engine shuts down. What moves where is placement.rs; the copies are the tiers' (tiers.rs).
//!
//! # The HBM budget
//!
//! The budget is the chunk pool's cap (chunk_pool.rs): how many physical chunks of HBM the
//! engine may hold. A node daemon leases it and changes it as tenants come and go; a model put
//! to sleep gives its HBM back. Growing is immediate: later page-ins simply create more
//! chunks. Shrinking takes three steps, none of which waits for a copy:
//!
//! 1. the pool stops handing out chunks while more are in use than the budget allows, so every
//!    demand from now on evicts first (`make_room` sees no chunk available);
//! 2. the excess is sent down at once, victims chosen by the policy (Belady with a schedule) as
//!    for any eviction, with the copies queued on the copy stream; chunks already moving down
//!    count towards it. Acquired chunks are never taken away: an excess that only they hold
//!    is sent down as they are released (`release` sheds the chunks it unpins first);
//! 3. as the copies land, `reap` gives the physical chunks beyond the budget back to the
//!    driver, unmapping the stale mappings that still point at them first.
//!
//! `set_hbm_budget` returns a ticket whose `finish` waits for the copies of step 2 and gives
//! their chunks back; without it, any later engine call does so as it reaps. Where the tiers
//! below have no room for the excess, it stays in HBM (over budget) until they do: the budget
//! change itself never fails for that, and neither does a `release`.

use crate::buffer::{Access, AllocOptions, BufferId, Region};
use crate::candidates::Among;
use crate::engine::{Inner, Target, Ticket, TicketWork};
use crate::error::retag;
use crate::error::Context;
use crate::fence::{Fence, Waits};
use crate::file_writes::Owner;
use crate::movement::Purpose;
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
        self.fits_in_all_tiers("alloc", size)?;
        let reserved = size.next_multiple_of(self.tiers.chunk);
        let va = self.tiers.device.reserve(reserved).during("alloc")?;
        Ok((self.state.add_buffer(va, size, reserved, options), va))
    }

    /// Refuses an allocation of `size` bytes that all tiers together could not hold.
    pub(crate) fn fits_in_all_tiers(&self, call: &'static str, size: usize) -> Result<()> {
        let file_cap = self.tiers.file.as_ref().map_or(0, |tier| tier.store.capacity_slots());
        let all_tiers = (self.tiers.pool.cap() + self.tiers.host.cap() + file_cap) * self.tiers.chunk;
        if size > all_tiers {
            return Err(Error::OutOfMemory {
                call,
                detail: format!(
                    "{size} bytes exceed all tiers together ({all_tiers} bytes: {})",
                    self.tiers.describe_tiers(&self.state)
                ),
            });
        }
        Ok(())
    }

    pub(crate) fn free(&mut self, id: BufferId) -> Result<()> {
        let buffer = self.buffer("free", id)?;
        let pinned_chunks = buffer.chunks().iter().filter(|c| c.pins() > 0).count();
        if pinned_chunks > 0 {
            return Err(Error::Acquired { call: "free", buffer: id, pinned_chunks });
        }
        // Transfers still running on its chunks end first: waited for with the lock released
        // where the façade runs this again after (`Engine::unlocked_waits`).
        let mut running = Vec::new();
        for fence in buffer.chunks().iter().flat_map(|c| c.in_flight().chain(c.leaving()).chain(c.landing())) {
            if !fence.is_done().during("free")? {
                running.push(Arc::clone(fence));
            }
        }
        self.wait_for("free", running)?;
        let buffer = self.buffer("free", id)?;
        // Unmap first, with the buffer still here: if cuMemUnmap fails the buffer stays and a
        // retry unmaps only what is still mapped. Its data is being discarded.
        let (va, reserved) = (buffer.va, buffer.reserved);
        self.tiers.unmap_buffer(&mut self.state, id).during("free")?;
        // A part of a shared reservation gives its range back with the last part (parts.rs).
        if let Some((va, bytes)) = self.parts.to_unreserve(id, va, reserved) {
            self.tiers.device.unreserve(va, bytes).during("free")?;
        }
        self.parts.freed(id);
        let copies = self.state.remove_buffer(id);
        self.strides.forget(id);
        if let Some(schedule) = self.schedule.as_mut() {
            schedule.forget(id);
        }
        let file_slots: Vec<_> = copies.iter().filter_map(|c| c.file).collect();
        for copy in copies {
            copy.peer.into_iter().for_each(|slot| self.tiers.peer.free(slot));
            copy.host.into_iter().for_each(|slot| self.tiers.host.free(slot));
        }
        self.tiers.free_file_slots(&file_slots);
        Ok(())
    }

    /// The distinct chunks `regions` cover, sorted; validates every region first.
    pub(crate) fn resolve(&self, call: &'static str, regions: &[Region]) -> Result<Vec<ChunkRef>> {
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
            let (first, last) = (region.offset / self.tiers.chunk, (end - 1) / self.tiers.chunk);
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
        self.count_acquire(refs.len());
        if access == Access::ReadWrite {
            if let Some(r) =
                regions.iter().find(|r| self.buffer("acquire", r.buffer).is_ok_and(|b| b.options.read_only))
            {
                return Err(Error::ReadOnly { call: "acquire", buffer: r.buffer });
            }
        }
        let (_, in_hbm) = self.tiers.serve_in_place(&mut self.state, "acquire", &refs, access)?;
        self.check_fits("acquire", &in_hbm)?;
        if in_hbm.iter().any(|&r| !self.state.chunk(r).is_resident()) {
            self.tiers.reap(&mut self.state)?;
            self.bring_in("acquire", &in_hbm, Purpose::Demand)?;
        }
        self.pin("acquire", &refs, access, stream)?;
        self.ahead_of_demand(regions);
        Ok(())
    }

    /// After an acquire, best effort (it stands whatever happens here): stride prefetch
    /// brings the next chunks of walked buffers into free HBM (stride.rs), and pre-eviction
    /// starts cheap victims down to keep HBM free (pre_evict.rs).
    fn ahead_of_demand(&mut self, regions: &[Region]) {
        if self.schedule.is_none() {
            for wanted in self.strides.next_chunks(&self.state, regions, self.tiers.chunk) {
                if self.tiers.pool.available() > 0 {
                    let _ = self.bring_in("stride prefetch", &wanted, Purpose::Prefetch);
                }
            }
        }
        if self.pre_evict_chunks == 0 || self.tiers.reap(&mut self.state).is_err() {
            return;
        }
        let free = self.tiers.pool.available() + self.tiers.in_flight.chunks_moving_down();
        let Some(short) = crate::pre_evict::shortfall(self.pre_evict_chunks, free) else { return };
        let Ok(victims) = self.victims(Among::Resident, "pre-evict", 2 * short, &[], None) else { return };
        let chosen = crate::pre_evict::cheap_victims(&self.state, victims, self.tiers.peer.free_slots(), short);
        if !chosen.is_empty() {
            let _ = self.send_victims_down("pre-evict", &chosen);
        }
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
        self.count_acquire(refs.len());
        let (_, in_hbm) = self.tiers.serve_in_place(&mut self.state, call, &refs, access)?;
        self.check_fits(call, &in_hbm)?;
        self.tiers.reap(&mut self.state)?;
        self.bring_in(call, &in_hbm, Purpose::Demand)?;
        self.pin(call, &refs, access, stream)?;
        Ok(self.state.va((regions[0].buffer, 0)))
    }

    fn count_acquire(&mut self, chunks: usize) {
        let counters = &mut self.tiers.counters;
        counters.acquires += 1;
        counters.largest_acquire = counters.largest_acquire.max(chunks as u64);
    }

    /// Refuses `chunks` chunks that could never be resident at once, whatever is evicted.
    pub(crate) fn check_cap(&self, call: &'static str, chunks: usize) -> Result<()> {
        let cap = self.tiers.pool.cap();
        if chunks > cap {
            return Err(Error::WouldNeverFit {
                call,
                requested: chunks * self.tiers.chunk,
                cap: cap * self.tiers.chunk,
            });
        }
        Ok(())
    }

    /// Refuses an acquire that could never be resident, or not while others hold their pins.
    fn check_fits(&mut self, call: &'static str, refs: &[ChunkRef]) -> Result<()> {
        self.check_cap(call, refs.len())?;
        let already = refs.iter().filter(|&&r| self.state.chunk(r).pins() > 0).count();
        let pinned = self.state.pinned();
        if pinned - already + refs.len() > self.tiers.pool.cap() {
            return Err(Error::OutOfMemory {
                call,
                detail: format!(
                    "{} bytes requested while {} bytes are acquired by others; {}",
                    refs.len() * self.tiers.chunk,
                    (pinned - already) * self.tiers.chunk,
                    self.tiers.describe_tiers(&self.state)
                ),
            });
        }
        Ok(())
    }

    /// Pins resident chunks and makes `stream` wait for those still arriving. Refused, pinning
    /// nothing, if a read from the file for any of them failed.
    fn pin(&mut self, call: &'static str, refs: &[ChunkRef], access: Access, stream: StreamHandle) -> Result<()> {
        if let Some(failure) = self.tiers.undo_failed_reads(&mut self.state, refs) {
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
            self.tiers.device.stream_wait_event(stream, fence.event()).during("acquire")?;
        }
        self.state.pin_all(refs);
        if access == Access::ReadWrite {
            for &r in refs {
                let reader = self.state.chunk(r).ready().cloned();
                // Its read from the file, if any, is done: `undo_failed_reads` waited for it.
                let copies = self.state.take_copies(r);
                self.tiers.give_up(copies, reader);
            }
        }
        Ok(())
    }

    pub(crate) fn release(&mut self, regions: &[Region], stream: StreamHandle) -> Result<()> {
        let refs = self.resolve("release", regions)?;
        if let Some(&(buffer, index)) = refs.iter().find(|&&r| self.state.chunk(r).pins() == 0) {
            let (offset, len) = (index * self.tiers.chunk, self.tiers.chunk);
            return Err(Error::NotAcquired { buffer, offset, len });
        }
        let fence = self.tiers.events.record(stream).during("release")?;
        for &r in &refs {
            self.state.unpin(r, Arc::clone(&fence));
        }
        if self.over_budget() {
            // The budget shrank while these were acquired: they leave first ("The HBM budget"
            // above). The release itself is done and waits for nothing: if they cannot leave
            // now (the tiers below are full, or room there is still being made, or the driver
            // fails), they stay until a later call makes room. A spill to the file started
            // here runs on; a later call commits it (`commit_ended_writes`).
            let waits_unlocked = std::mem::replace(&mut self.wait_unlocked, true);
            let shed = self.shed_excess("release", &refs);
            self.wait_unlocked = waits_unlocked;
            if let Err(Error::MustWait(Waits { spill: Some(spill), .. })) = shed {
                self.tiers.writes.abandon(Owner::Spill(spill));
            }
        }
        Ok(())
    }

    pub(crate) fn prefetch(&mut self, regions: &[Region]) -> Result<()> {
        let refs = self.resolve("prefetch", regions)?;
        self.tiers.reap(&mut self.state)?;
        self.bring_in("prefetch", &refs, Purpose::Prefetch)?;
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
        if self.spread_resident {
            let (cap, g, state) = (self.tiers.pool.cap(), self.tiers.chunk, &self.state);
            schedule.plan_residency(cap, budget / g, |id| state.buffer(id).map_or(0, |b| b.chunks().len()));
        }
        self.tiers.reap(&mut self.state)?;
        let departures = self.state.departures();
        if schedule.is_quiet(departures) {
            return Ok(0); // Every chunk of the schedule is still resident (schedule.rs).
        }
        let (g, look_past) = (self.tiers.chunk, self.look_past);
        let Some(plan) = schedule.window(&self.state, g, budget, look_past) else {
            schedule.set_quiet(departures);
            return Ok(0);
        };
        let mut started = 0;
        for (purpose, mut refs) in plan {
            refs.sort_unstable();
            refs.dedup();
            if refs.is_empty() {
                continue;
            }
            self.bring_in(call, &refs, purpose)?;
            let landed = refs.iter().filter(|&&r| self.state.chunk(r).is_resident()).count();
            started += landed * g;
            if landed < refs.len() {
                break; // No room without evicting something needed sooner (or, past the window, busy).
            }
        }
        Ok(started)
    }

    pub(crate) fn target_refs(&self, call: &'static str, target: Target) -> Result<Vec<ChunkRef>> {
        let ids: Vec<BufferId> = match target {
            Target::Buffer(id) => {
                self.buffer(call, id)?;
                vec![id]
            }
            Target::All => self.state.ids(),
        };
        let chunks = |id| self.state.buffer(id).expect("a live buffer").chunks().len();
        Ok(ids.into_iter().flat_map(|id| (0..chunks(id)).map(move |i| (id, i))).collect())
    }

    pub(crate) fn page_in_start(&mut self, target: Target) -> Result<Ticket> {
        let refs = self.target_refs("page_in", target)?;
        self.check_cap("page_in", refs.len())?;
        self.tiers.reap(&mut self.state)?;
        let fences = self.bring_in("page_in", &refs, Purpose::Demand)?;
        Ok(self.ticket(fences))
    }

    pub(crate) fn page_out_start(&mut self, target: Target) -> Result<Ticket> {
        let refs = self.outgoing_refs("page_out", target)?;
        self.tiers.reap(&mut self.state)?;
        let fences = self.send_target_down("page_out", &refs, true)?;
        Ok(self.ticket(fences))
    }

    /// Sends down those of `refs` that are resident; returns the fences after which all of
    /// `refs` have left, counting those already leaving: sent down by this call before it
    /// stopped to wait with the lock released (`Engine::unlocked_waits` runs it again), or by
    /// others. Without `peer_allowed`, none goes to the peer tier (`Inner::send_down_to`).
    fn send_target_down(
        &mut self,
        call: &'static str,
        refs: &[ChunkRef],
        peer_allowed: bool,
    ) -> Result<Vec<Arc<Fence>>> {
        let mut fences: Vec<Arc<Fence>> = Vec::new();
        for fence in refs.iter().filter_map(|&r| self.state.chunk(r).leaving()) {
            if !fences.iter().any(|f| Arc::ptr_eq(f, fence)) {
                fences.push(Arc::clone(fence));
            }
        }
        let resident: Vec<ChunkRef> = refs.iter().copied().filter(|&r| self.state.chunk(r).is_resident()).collect();
        fences.extend(self.send_down_to(call, &resident, peer_allowed)?);
        Ok(fences)
    }

    /// The chunks of an outgoing target; refused if any of them is acquired.
    fn outgoing_refs(&self, call: &'static str, target: Target) -> Result<Vec<ChunkRef>> {
        let refs = self.target_refs(call, target)?;
        let pinned: Vec<&ChunkRef> = refs.iter().filter(|&&r| self.state.chunk(r).pins() > 0).collect();
        if let Some(&&(buffer, _)) = pinned.first() {
            let pinned_chunks = pinned.iter().filter(|r| r.0 == buffer).count();
            return Err(Error::Acquired { call, buffer, pinned_chunks });
        }
        Ok(refs)
    }

    /// Brings `incoming` in and sends `outgoing` down, adding the fences to wait for to
    /// `fences`. Run again after a wait with the lock released (`Engine::unlocked_waits`), it
    /// does what is left: incoming chunks already in HBM bring nothing, outgoing chunks
    /// already leaving bring their fences.
    pub(crate) fn exchange_start(
        &mut self,
        outgoing: Target,
        incoming: Target,
        fences: &mut Vec<Arc<Fence>>,
    ) -> Result<()> {
        let call = "exchange";
        let out = self.outgoing_refs(call, outgoing)?;
        let inc = self.target_refs(call, incoming)?;
        if let Some(&(buffer, _)) = inc.iter().find(|r| out.binary_search(r).is_ok()) {
            return Err(Error::Conflict { call, buffer });
        }
        self.check_cap(call, inc.len())?;
        self.tiers.reap(&mut self.state)?;
        // Mapping waits for copies to the host in flight (on the H200 a batch of 16 chunks took
        // 17 ms instead of 0.35 ms during a 1 GiB copy down), while copies up do not delay it.
        // So the incoming chunks are mapped first, their copies up streaming meanwhile, and only
        // then are the outgoing copies issued: the two directions overlap.
        fences.extend(self.bring_in(call, &inc, Purpose::Demand)?);
        for fence in self.send_target_down(call, &out, true)? {
            if !fences.iter().any(|f| Arc::ptr_eq(f, &fence)) {
                fences.push(fence);
            }
        }
        Ok(())
    }

    pub(crate) fn ticket(&mut self, fences: Vec<Arc<Fence>>) -> Ticket {
        self.ticket_for(TicketWork { fences, ..TicketWork::default() })
    }

    fn ticket_for(&mut self, work: TicketWork) -> Ticket {
        let id = self.next_ticket;
        self.next_ticket += 1;
        self.tickets.insert(id, work);
        Ticket(id)
    }

    pub(crate) fn page_out_to_file_start(&mut self, target: Target) -> Result<Ticket> {
        let call = "page_out_to_file";
        if self.tiers.file.is_none() {
            return Err(Error::Config(format!("{call}: there is no file tier (set TIERMEM_FILE)")));
        }
        let refs = self.outgoing_refs(call, target)?;
        self.tiers.reap(&mut self.state)?;
        // To the file through the host tier; chunks already in the peer tier stay there.
        let fences = self.send_target_down(call, &refs, false)?;
        let file_write = self.tiers.start_file_write(&mut self.state, call, &refs)?;
        let ticket = self.ticket_for(TicketWork { fences, then_to_file: refs });
        if let Some(write) = file_write {
            self.tiers.writes.insert(ticket.0, write);
        }
        Ok(ticket)
    }

    /// Frees every buffer and gives every device resource back.
    pub(crate) fn shutdown(&mut self) -> Result<()> {
        self.state.unpin_everything();
        // Background writes read host slots: they end before anything is unpinned.
        self.tickets.clear();
        for write in self.tiers.writes.take_running() {
            let (items, outcome) = write.join();
            let _ = self.tiers.commit_file_write(&mut self.state, items, outcome);
        }
        let mut first_error = None;
        for id in self.state.ids() {
            if let Err(e) = self.free(id) {
                first_error.get_or_insert(e);
                self.state.forget_buffer(id);
            }
        }
        for stream in [self.tiers.streams.up, self.tiers.streams.down, self.tiers.streams.prefetch] {
            self.tiers.device.synchronize_stream(stream).during("shutdown")?;
        }
        self.tiers.multipath.release(self.tiers.device.as_ref()).during("shutdown")?;
        self.tiers.reap(&mut self.state)?;
        for slot in self.tiers.in_flight.drain_retiring() {
            self.tiers.free_below(slot);
        }
        if let Some(tier) = self.tiers.file.as_mut() {
            tier.reader.stop();
        }
        self.tiers.pool.release_all(self.tiers.device.as_ref()).during("shutdown")?;
        self.tiers.host.release_all(self.tiers.device.as_ref()).during("shutdown")?;
        self.tiers.peer.release_all(self.tiers.device.as_ref()).during("shutdown")?;
        for stream in [self.tiers.streams.up, self.tiers.streams.down, self.tiers.streams.prefetch] {
            self.tiers.device.destroy_stream(stream).during("shutdown")?;
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Sets the HBM budget to `bytes` (whole chunks, rounded down) and starts sending down what
    /// exceeds it. Returns the fences of those copies.
    pub(crate) fn set_hbm_budget(&mut self, bytes: usize) -> Result<Vec<Arc<Fence>>> {
        let call = "set_hbm_budget";
        let total = self.tiers.device.info().total_bytes;
        if bytes > total {
            return Err(Error::Config(format!(
                "{call}: {bytes} bytes is more than the GPU's {total} bytes of memory; ask for at most that"
            )));
        }
        self.tiers.pool.set_cap(bytes / self.tiers.chunk);
        self.tiers.reap(&mut self.state)?;
        match self.shed_excess(call, &[]) {
            // Nowhere to put the excess now (the tiers below are full): it stays, and the next
            // page-in must make room first.
            Err(Error::OutOfMemory { .. }) => Ok(Vec::new()),
            shed => shed,
        }
    }

    /// Whether more chunks are in use than the budget allows, counting those moving down as
    /// gone.
    pub(crate) fn over_budget(&self) -> bool {
        // `release` asks this every time: the common answer costs no scan.
        let excess = self.tiers.pool.excess();
        excess > 0 && excess > self.tiers.in_flight.chunks_moving_down()
    }

    /// Sends down, without waiting, as many unacquired resident chunks as the pool holds beyond
    /// the budget (less those already moving down): those of `first` (chunks just released),
    /// then the policy's choice.
    pub(crate) fn shed_excess(&mut self, call: &'static str, first: &[ChunkRef]) -> Result<Vec<Arc<Fence>>> {
        let need = self.tiers.pool.excess().saturating_sub(self.tiers.in_flight.chunks_moving_down());
        if need == 0 {
            return Ok(Vec::new());
        }
        let mut victims: Vec<ChunkRef> = first
            .iter()
            .copied()
            .filter(|&r| {
                let chunk = self.state.chunk(r);
                chunk.pins() == 0 && chunk.is_resident()
            })
            .take(need)
            .collect();
        if victims.len() < need {
            // Without a schedule only settled chunks are offered; the others leave later.
            let more = self.victims(Among::Resident, call, need - victims.len(), &[], None)?;
            victims.extend(more.into_iter().filter(|r| !first.contains(r)));
            victims.truncate(need);
        }
        victims.sort_unstable();
        victims.dedup();
        if victims.is_empty() {
            return Ok(Vec::new());
        }
        self.send_victims_down(call, &victims)
    }
}
