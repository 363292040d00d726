//! Placement: what comes into HBM and what leaves it. Bringing chunks in (cancelling moves
//! down, keeping streamed chunks' homes, making room), sending chunks down (finding host slots,
//! spilling the host tier to the file when it is full), and making room: victims chosen by the
//! policy (Belady's choice while a schedule is set) among the chunks candidates.rs offers, sent
//! down and waited for. The copies themselves are the tiers' (movement.rs, down.rs). Giving a
//! lender's memory back is in lending_back.rs.
//!
//! This and a page-in ahead of the schedule (which waits for its victims to pace the caller to
//! the GPU) are where the host waits for copies: through `wait_for`, which in the calls that
//! run through `Engine::unlocked_waits` (every call that moves chunks but `release`, which
//! never waits, and the peer tier's reclaim) hands the wait to the façade to do with the lock
//! released. There a full host tier spills to the file in the background too
//! (`spill_in_background`): the call waits for the write without the lock and commits it when
//! it runs again. A reclaim waits under the lock (`Tiers::wait_here`): a lender asking for its
//! memory comes first. A dirty chunk leaving to make room is not waited for: it hands its
//! physical chunk over, and the copy coming in waits for it on the GPU (hand_overs.rs).

use crate::candidates::{candidates, next_settling, Among, Settling};
use crate::down::COPIES_OUT_OF_HBM;
use crate::engine::Inner;
use crate::error::Context;
use crate::fence::{settled, Fence, Waits};
use crate::host_tier::Slot;
use crate::movement::Purpose;
use crate::state::{Below, ChunkRef, Location};
use crate::sync::Done;
use crate::{Error, Result};
use std::sync::Arc;
use tiermem_policy::{leave_hbm, new_policy, Candidate, Leave, PolicyKind, Tier};

/// Chunks a demand brings in per batch (32 MiB of 4 MiB chunks): its copies (~0.6 ms at the
/// PCIe link's speed) overlap the making and mapping of the next batch's physical chunks where
/// they must be made (~40 µs a chunk on the H200, after HBM went back to the driver).
const DEMAND_BATCH: usize = 8;

impl Inner {
    /// Makes `wanted` (sorted) resident, or as many as free HBM allows for a prefetch: cancels
    /// moves down, makes room by policy, takes physical chunks; the tiers then copy.
    /// Returns the fences after which every chunk brought in has arrived (none if nothing moved).
    pub fn bring_in(&mut self, call: &'static str, wanted: &[ChunkRef], purpose: Purpose) -> Result<Vec<Arc<Fence>>> {
        debug_assert!(wanted.windows(2).all(|w| w[0] < w[1]), "chunk lists are sorted");
        let mut todo = Vec::new();
        for &r in wanted {
            match self.state.chunk(r).location() {
                // Still in HBM: cancel the move. Its slot holds (or will, once the fence is done)
                // an identical copy, so it stays clean; users wait for the copy before writing.
                Location::Hbm { leaving: true, .. } => self.state.cancel_leaving(r),
                Location::Hbm { leaving: false, .. } => {}
                // Acquired where it lies in the peer tier (movement.rs, "Reading in place"): it stays there. Mapped
                // there, it is read there at no cost: only a demand moves it.
                Location::Peer(_) if self.state.chunk(r).pinned_in_place() => {}
                Location::Peer(_) if purpose != Purpose::Demand && self.state.chunk(r).is_in_place() => {}
                Location::Empty | Location::Peer(_) | Location::Host(_) | Location::File(_) => todo.push(r),
            }
        }
        if todo.is_empty() {
            return Ok(Vec::new());
        }
        // A demand whose physical chunks must mostly be made (after HBM went back to the driver)
        // and fit without evicting comes in batch by batch (`DEMAND_BATCH`), each one's copies
        // started before the next batch's chunks are made and mapped, which then overlaps the
        // copies. Anything else comes in at once: batches that evict wait for their victims one
        // batch at a time (on the H200 an LRU cycle through twice its HBM ran 14% slower so).
        let makes = todo.len().saturating_sub(self.tiers.pool.idle());
        let batched = purpose == Purpose::Demand && makes > DEMAND_BATCH && self.tiers.pool.available() >= todo.len();
        if !batched {
            return self.bring_in_batch(call, todo, wanted, purpose);
        }
        let mut fences = Vec::new();
        for batch in todo.chunks(DEMAND_BATCH) {
            fences.extend(self.bring_in_batch(call, batch.to_vec(), wanted, purpose)?);
        }
        Ok(fences)
    }

    /// `bring_in` for `todo` (chunks of `wanted` not in HBM), protecting all of `wanted`.
    fn bring_in_batch(
        &mut self,
        call: &'static str,
        mut todo: Vec<ChunkRef>,
        wanted: &[ChunkRef],
        purpose: Purpose,
    ) -> Result<Vec<Arc<Fence>>> {
        let horizon = match purpose {
            Purpose::Demand => Some(0),
            Purpose::Ahead { horizon } | Purpose::Swap { horizon } => Some(horizon),
            Purpose::Prefetch => None,
        };
        // Homes (homes.rs) only for the shortfall: free room (a budget that grew) is taken
        // first, mapped afresh once, and only as many holders are sent home as free chunks are
        // missing, so nothing that now fits is evicted.
        let short = todo.len().saturating_sub(self.tiers.pool.available());
        if let (Some(schedule), Some(horizon), true) = (self.schedule.as_ref(), horizon, short > 0) {
            let mut holders = crate::homes::holders_to_send_home(&self.state, schedule, &todo, wanted, horizon);
            if matches!(purpose, Purpose::Swap { .. }) {
                // A swap waits for nothing: only clean holders the GPU has finished with leave.
                let mut idle = Vec::with_capacity(holders.len());
                for &h in &holders {
                    let chunk = self.state.chunk(h);
                    let clean = chunk.host().is_some();
                    if clean && settled(chunk.ready()).during(call)? && settled(chunk.busy()).during(call)? {
                        idle.push(h);
                    }
                }
                holders = idle;
            }
            holders.truncate(short);
            if !holders.is_empty() {
                self.send_away(call, &holders)?;
            }
        }
        // Chunks coming in as zeros copy nothing in: they may take the physical chunks of dirty
        // chunks still being copied down, their fills waiting on the GPU (hand_overs.rs).
        let zeros = todo.iter().all(|&r| self.state.chunk(r).location() == Location::Empty);
        match purpose {
            Purpose::Demand => self.make_room(call, todo.len(), wanted, zeros)?,
            // A swap evicts only the holders of its chunks' homes (above): never a chunk Belady
            // keeps, and every chunk comes back to the physical chunk it left (no mapping).
            Purpose::Prefetch | Purpose::Swap { .. } => {}
            Purpose::Ahead { horizon } if self.ahead_waits => {
                while self.tiers.pool.available() < todo.len() {
                    let short = todo.len() - self.tiers.pool.available();
                    if !self.evict_beyond(call, short, wanted, horizon)? {
                        break;
                    }
                }
            }
            // Room for the window is made without waiting: victims needed later than the
            // window start down (behind the GPU's last use of them, on the device), counting
            // those already on their way; what is free now is filled now, and what they free
            // is filled by a later page-ahead. The host thread goes on with its step.
            Purpose::Ahead { horizon } => {
                self.tiers.reap(&mut self.state)?;
                let coming = self.tiers.pool.available() + self.tiers.in_flight.chunks_moving_down();
                if coming < todo.len() {
                    let mut victims =
                        self.victims(Among::Resident, call, todo.len() - coming, wanted, Some(horizon))?;
                    // Never the planned resident set: paging ahead would erode it (schedule.rs).
                    if let Some(schedule) = self.schedule.as_ref() {
                        victims.retain(|r| !schedule.is_kept(r.0));
                    }
                    if !victims.is_empty() {
                        self.send_victims_down(call, &victims)?;
                        self.tiers.reap(&mut self.state)?;
                    }
                }
                if zeros {
                    let short = todo.len().saturating_sub(self.tiers.pool.available());
                    self.hand_over_moving(call, short, wanted)?;
                }
            }
        }
        let mut phys = self.tiers.take_phys(&self.state, call, &todo)?;
        // The driver may give fewer chunks than the cap promised (the cap then shrinks): a demand
        // evicts for the rest.
        while purpose == Purpose::Demand && phys.len() < todo.len() {
            if let Err(e) = self.make_room(call, todo.len() - phys.len(), wanted, zeros) {
                phys.into_iter().for_each(|p| self.tiers.pool.give(p));
                return Err(e);
            }
            let more = self.tiers.take_phys(&self.state, call, &todo[phys.len()..])?;
            phys.extend(more);
        }
        todo.truncate(phys.len());
        if todo.is_empty() {
            return Ok(Vec::new());
        }
        self.tiers.copy_in(&mut self.state, call, &todo, phys, purpose)
    }

    /// Moves resident, unacquired chunks (sorted) out of HBM. Returns the fences after which
    /// every chunk that did not leave at once will have left (copies down, or last uses).
    pub fn send_down(&mut self, call: &'static str, refs: &[ChunkRef]) -> Result<Vec<Arc<Fence>>> {
        self.send_down_to(call, refs, true)
    }

    /// As `send_down`; without `peer_allowed`, no chunk goes to (or stays only in) the peer
    /// tier: spare peer copies of `refs` are given up first, so those chunks go through the
    /// host (`page_out_to_file`, whose chunks must reach the file).
    pub fn send_down_to(
        &mut self,
        call: &'static str,
        refs: &[ChunkRef],
        peer_allowed: bool,
    ) -> Result<Vec<Arc<Fence>>> {
        if !peer_allowed {
            for &r in refs {
                let chunk = self.state.chunk(r);
                if chunk.is_resident() && chunk.peer().is_some() {
                    let reader = chunk.ready().cloned();
                    let slot = self.state.drop_peer_copy(r).expect("a peer copy");
                    self.tiers.retire(Below::Peer(slot), reader);
                }
            }
        }
        let (dirty, mut fences) = self.tiers.send_clean_down(&mut self.state, call, refs)?;
        let (to_peer, peer_slots, dirty) = match peer_allowed {
            true => self.split_for_peer(dirty),
            false => (Vec::new(), Vec::new(), dirty),
        };
        if !to_peer.is_empty() {
            fences.extend(self.tiers.copy_dirty_down(&mut self.state, call, &to_peer, peer_slots)?);
        }
        // More than the host tier can ever hold at once, with a file tier below: go down in
        // rounds that fit, each waited for, so that the next round can spill the one before it.
        let room = self.tiers.host.cap().max(1);
        let in_rounds = dirty.len() > room && self.tiers.file.is_some();
        let round = if in_rounds { room } else { dirty.len().max(1) };
        for dirty in dirty.chunks(round) {
            let slots = self.host_slots(call, dirty)?.into_iter().map(Below::Host).collect();
            let round_fences = self.tiers.copy_dirty_down(&mut self.state, call, dirty, slots)?;
            if in_rounds {
                self.wait_for(call, round_fences.clone())?;
                self.tiers.reap(&mut self.state)?;
            }
            fences.extend(round_fences);
        }
        Ok(fences)
    }

    /// Where the dirty chunks leaving HBM go: each to the fastest tier with room
    /// (`policy::leave_hbm`), the peer tier while its lenders lend a slot (spare peer copies of
    /// resident chunks are given up for it). Returns the chunks for the peer tier with their
    /// slots, and the rest, for the host tier.
    fn split_for_peer(&mut self, dirty: Vec<ChunkRef>) -> (Vec<ChunkRef>, Vec<Below>, Vec<ChunkRef>) {
        if !self.tiers.peer.exists() || dirty.is_empty() {
            return (Vec::new(), Vec::new(), dirty);
        }
        let device = Arc::clone(&self.tiers.device);
        let mut slots = self.tiers.peer.alloc_up_to(device.as_ref(), dirty.len());
        if slots.len() < dirty.len() && self.tiers.reclaim_peer_copies(&mut self.state, dirty.len() - slots.len()) > 0 {
            slots.extend(self.tiers.peer.alloc_up_to(device.as_ref(), dirty.len() - slots.len()));
        }
        let mut left = slots.len();
        let (mut peer, mut host) = (Vec::new(), Vec::new());
        for r in dirty {
            match leave_hbm(None, &COPIES_OUT_OF_HBM, |tier| tier != Tier::Peer || left > 0) {
                Leave::CopyTo(Tier::Peer) => {
                    left -= 1;
                    peer.push(r);
                }
                _ => host.push(r),
            }
        }
        (peer, slots.into_iter().map(Below::Peer).collect(), host)
    }

    /// Host slots for `dirty`. When the tier is full: give up clean copies of resident chunks,
    /// commit background writes that have ended, spill cold chunks to the file tier, and wait
    /// for slots that copies or file writes still read — with the lock released where the call
    /// runs through `Engine::unlocked_waits`.
    pub(crate) fn host_slots(&mut self, call: &'static str, dirty: &[ChunkRef]) -> Result<Vec<Slot>> {
        let n = dirty.len();
        loop {
            if let Some(slots) = self.tiers.host.alloc(self.tiers.device.as_ref(), n).during(call)? {
                return Ok(slots);
            }
            self.tiers.reclaim_host_copies(&mut self.state, n);
            if let Some(slots) = self.tiers.host.alloc(self.tiers.device.as_ref(), n).during(call)? {
                return Ok(slots);
            }
            // Their slots, and those of the chunks they moved to the file, come free.
            if self.tiers.commit_ended_writes(&mut self.state) {
                continue;
            }
            let spilled = self.spill_to_file(call, n)?;
            if let Some(slots) = self.tiers.host.alloc(self.tiers.device.as_ref(), n).during(call)? {
                return Ok(slots);
            }
            match self.tiers.next_host_release(&self.state) {
                Some(fence) => {
                    self.wait_for(call, vec![fence])?;
                    self.tiers.reap(&mut self.state)?;
                }
                None if spilled => {}
                // Slots spilled while a background write still reads them come back once it is
                // committed: waited for with the lock released where the call can, else here.
                None if self.wait_unlocked && !self.writes_reading_freed_slots().is_empty() => {
                    let writes = self.writes_reading_freed_slots();
                    return Err(Error::MustWait(Waits { writes, ..Waits::fences(call, Vec::new()) }));
                }
                None if self.tiers.host.has_freed_while_held() && self.tiers.complete_a_file_write(&mut self.state) => {
                }
                None => {
                    // A copy up may have completed since `reclaim_host_copies` looked, freeing
                    // its copy for reclaiming: one more try before giving up.
                    self.tiers.reclaim_host_copies(&mut self.state, n);
                    if let Some(slots) = self.tiers.host.alloc(self.tiers.device.as_ref(), n).during(call)? {
                        return Ok(slots);
                    }
                    return Err(Error::OutOfMemory {
                        call,
                        detail: format!(
                            "{n} chunks must be copied to the host tier, which is full ({}); {}",
                            self.tiers.host_holders(&self.state),
                            self.tiers.describe_tiers(&self.state)
                        ),
                    });
                }
            }
        }
    }

    /// The signals of the background writes still reading host slots let go meanwhile.
    fn writes_reading_freed_slots(&self) -> Vec<Arc<Done>> {
        let host = &self.tiers.host;
        self.tiers.writes.reading(|slot| host.freed_while_held(slot))
    }

    /// Makes room for `needed` host slots by spilling the coldest `Host` chunks to the file.
    /// `false` if there is no file tier or nothing to spill. Under `Engine::unlocked_waits` the
    /// write runs in the background ([`Inner::spill_in_background`]); else it runs here, under
    /// the lock.
    pub fn spill_to_file(&mut self, call: &'static str, needed: usize) -> Result<bool> {
        if self.tiers.file.is_none() {
            return Ok(false);
        }
        let victims = self.victims(Among::OnHost, call, needed, &[], None)?;
        if victims.is_empty() {
            return Ok(false);
        }
        self.spill(call, &victims)?;
        Ok(true)
    }

    /// Moves those of `refs` (sorted) that live in buffers not freed and lie on the host now
    /// into the file tier: in the background where the call runs through
    /// `Engine::unlocked_waits` (which runs it again once the write is done, finding them
    /// gone from the host), else written here, under the lock.
    pub fn spill(&mut self, call: &'static str, refs: &[ChunkRef]) -> Result<()> {
        // A write that has ended (another ticket's, covering some of these) is committed
        // first: its chunks then leave without a write, and a call run again after waiting for
        // it finds it done.
        self.tiers.commit_ended_writes(&mut self.state);
        let mut on_host: Vec<ChunkRef> = refs
            .iter()
            .copied()
            .filter(|&r| self.state.buffer(r.0).is_some())
            .filter(|&r| matches!(self.state.chunk(r).location(), Location::Host(_)))
            .collect();
        on_host.sort_unstable();
        if on_host.is_empty() {
            return Ok(());
        }
        if self.wait_unlocked {
            return self.spill_in_background(call, &on_host).map(|_| ());
        }
        self.tiers.spill_chunks(&mut self.state, call, &on_host)
    }

    /// Spills `victims` (sorted, located on the host) without writing under the lock: those the
    /// file already holds leave the host tier now; the others are written by a background write
    /// (file_writes.rs) started here — or already running, for a slot another write holds —
    /// which the call waits for with the lock released ([`Error::MustWait`]). Run again, the
    /// call commits it (`Engine::unlocked_waits`) and `host_slots` finds the slots free.
    fn spill_in_background(&mut self, call: &'static str, victims: &[ChunkRef]) -> Result<bool> {
        let (in_file, unwritten): (Vec<ChunkRef>, Vec<ChunkRef>) =
            victims.iter().partition(|&&r| self.state.chunk(r).file().is_some());
        // No write: the file holds their bytes.
        self.tiers.spill_chunks(&mut self.state, call, &in_file)?;
        let started = self.tiers.start_file_write(&mut self.state, call, &unwritten)?;
        let spill = started.map(|write| self.tiers.writes.insert_spill(write));
        let slots: Vec<Slot> = unwritten.iter().filter_map(|&r| self.state.chunk(r).host()).collect();
        let writes = self.tiers.writes.reading(|slot| slots.contains(&slot));
        if writes.is_empty() {
            return Ok(true);
        }
        Err(Error::MustWait(Waits { writes, spill, ..Waits::fences(call, Vec::new()) }))
    }

    /// Frees HBM until `need` chunks can be taken from the pool, evicting by policy. For chunks
    /// coming in as zeros (`hand_over`), dirty chunks copied to the host hand their physical
    /// chunks over rather than being waited for (hand_overs.rs, "Where").
    pub(crate) fn make_room(
        &mut self,
        call: &'static str,
        need: usize,
        protect: &[ChunkRef],
        hand_over: bool,
    ) -> Result<()> {
        loop {
            self.tiers.reap(&mut self.state)?;
            let available = self.tiers.pool.available();
            if available >= need {
                return Ok(());
            }
            let short = need - available;
            // Dirty chunks already on their way to the host hand their physical chunks over (the
            // call may also have found some landed meanwhile).
            if hand_over
                && (self.hand_over_moving(call, short, protect)? > 0 || self.tiers.pool.available() > available)
            {
                continue;
            }
            if self.evict(call, short, protect, None, hand_over)? {
                continue;
            }
            match next_settling(&self.tiers.in_flight, &self.state, protect) {
                Settling::Wait(fence) => self.wait_for(call, vec![fence])?,
                Settling::Now => {}
                Settling::Never => {
                    return Err(Error::OutOfMemory {
                        call,
                        detail: format!(
                        "{} more bytes of HBM are needed and every resident chunk is acquired or being acquired; {}",
                        short * self.tiers.chunk,
                        self.tiers.describe_tiers(&self.state)
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
    pub(crate) fn evict_beyond(
        &mut self,
        call: &'static str,
        need: usize,
        protect: &[ChunkRef],
        horizon: u64,
    ) -> Result<bool> {
        self.tiers.reap(&mut self.state)?;
        self.evict(call, need, protect, Some(horizon), false)
    }

    /// Evicts up to `count` chunks that may leave (next used beyond `horizon`, if given), chosen
    /// by the policy (Belady while a schedule is set), and waits until they have left — or,
    /// with `hand_over`, until those not copied to the host have (hand_overs.rs).
    /// `false` if there was nothing to evict.
    fn evict(
        &mut self,
        call: &'static str,
        count: usize,
        protect: &[ChunkRef],
        horizon: Option<u64>,
        hand_over: bool,
    ) -> Result<bool> {
        let victims = self.victims(Among::Resident, call, count, protect, horizon)?;
        if victims.is_empty() {
            return Ok(false);
        }
        if hand_over {
            self.send_away(call, &victims)?;
        } else {
            let fences = self.send_victims_down(call, &victims)?;
            self.wait_for(call, fences)?;
            self.tiers.reap(&mut self.state)?;
        }
        Ok(true)
    }

    /// Up to `count` chunks that may leave (as for [`Inner::candidates`]), the policy's
    /// choice, sorted.
    pub(crate) fn victims(
        &mut self,
        among: Among,
        call: &'static str,
        count: usize,
        protect: &[ChunkRef],
        horizon: Option<u64>,
    ) -> Result<Vec<ChunkRef>> {
        let (refs, candidates) =
            candidates(&self.state, self.schedule.as_ref(), among, protect, horizon, count).during(call)?;
        let mut victims: Vec<ChunkRef> = self.select_victims(&candidates, count).into_iter().map(|i| refs[i]).collect();
        victims.sort_unstable();
        Ok(victims)
    }

    /// Waits for `fences`: with the lock released if the façade retries this call (returned
    /// to it as [`Error::MustWait`]), else here, under the lock. Counted as eviction waits.
    pub(crate) fn wait_for(&mut self, call: &'static str, fences: Vec<Arc<Fence>>) -> Result<()> {
        if fences.is_empty() {
            return Ok(());
        }
        if self.wait_unlocked {
            return Err(Error::MustWait(Waits::fences(call, fences)));
        }
        self.tiers.wait_here(call, fences)
    }

    /// Sends `victims` (sorted) down without waiting, counted as evictions; with a schedule
    /// they are marked as streamed (homes.rs).
    pub(crate) fn send_victims_down(&mut self, call: &'static str, victims: &[ChunkRef]) -> Result<Vec<Arc<Fence>>> {
        self.tiers.counters.evictions += victims.len() as u64;
        if self.schedule.is_some() {
            victims.iter().for_each(|&r| self.state.mark_streamed(r));
        }
        self.send_down(call, victims)
    }

    /// The policy's choice among `candidates`; Belady's while a schedule is set.
    pub fn select_victims(&mut self, candidates: &[Candidate], count: usize) -> Vec<usize> {
        match self.schedule {
            Some(_) => new_policy(PolicyKind::Belady, 0).select_victims(candidates, count),
            None => self.policy.select_victims(candidates, count),
        }
    }
}
