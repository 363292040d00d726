//! Handing over: a chunk coming into HBM takes the physical chunk of a chunk that is leaving,
//! before the one leaving has gone, and its copy waits for the one leaving on the device.
//!
//! A clean chunk sent down leaves HBM once its last use has run: nothing is copied, but until
//! that fence completes its physical chunk is neither idle nor takeable. So a page-in that
//! needed the room waited for it on the host (`make_room`), and paging ahead without waiting
//! brought in only what was idle and left the rest to a demand later, which waited. The host
//! was then paced by the GPU's kernels, and the link idled between copies it could have run:
//! on the H200 a tied Llama's decode left the link idle 9 ms of a 43 ms pass while the host
//! waited 9 ms for evictions.
//!
//! Handing over moves that wait to the device. The incoming chunk maps the leaving chunk's
//! physical chunk at once (or finds its address still mapping it: a streamed chunk coming back
//! to its home, homes.rs), and the stream of its copy waits for the leaving chunk's last-use
//! event before the copy writes. The leaving chunk leaves HBM at once (`ChunkTable::hand_over`):
//! its address keeps mapping the physical chunk, stale, and its last use stays its `busy`
//! fence, which whoever unmaps that address waits for first (`unmap_below`, `free`).
//!
//! Which chunks may hand over: those whose move down is their last use and nothing else —
//! clean (no copy down of their own, so nothing of theirs is still being written below),
//! arrived (their `ready` copy done), leaving behind their `busy` fence itself — and only
//! while the engine is within its HBM budget (chunks sent down to meet a smaller budget must
//! go back to the driver, not to the next chunk). Chunks read in from the file are handed
//! nothing: the file reader copies on streams of its own, which would not wait.
//!
//! Why the waits cannot deadlock: a kernel waits only for copies enqueued before it (an acquire
//! enqueues its chunks' copies, or waits until the file reader has, before it returns), and a
//! last use's fence is recorded after its kernels. A copy that waits for that fence is enqueued
//! later still, so no work it waits for can be waiting for it.

use crate::fence::Fence;
use crate::state::{ChunkRef, ChunkTable, Location};
use crate::sync::Arc;
use crate::tiers::Tiers;
use tiermem_mechanism::{PhysHandle, Result};

impl Tiers {
    /// Whether chunk `r`, moving down, may hand its physical chunk over now.
    pub(crate) fn may_hand_over(&self, state: &ChunkTable, r: ChunkRef) -> Result<bool> {
        if self.pool.excess() > 0 {
            return Ok(false);
        }
        let Some(buffer) = state.buffer(r.0) else { return Ok(false) };
        let chunk = &buffer.chunks()[r.1];
        let (Some(leaving), Some(busy)) = (chunk.leaving(), chunk.busy()) else { return Ok(false) };
        if !Arc::ptr_eq(leaving, busy) {
            return Ok(false);
        }
        match chunk.ready() {
            Some(ready) => ready.is_done(),
            None => Ok(true),
        }
    }

    /// How many chunks moving down may hand over now: room a demand need not wait for.
    pub(crate) fn handovers_ready(&self, state: &ChunkTable) -> Result<usize> {
        let mut ready = 0;
        for (_, r) in self.in_flight.moving() {
            ready += usize::from(self.may_hand_over(state, r)?);
        }
        Ok(ready)
    }

    /// The chunk moving down longest that may hand over now, if any.
    pub(crate) fn next_handover(&self, state: &ChunkTable) -> Result<Option<ChunkRef>> {
        for (_, r) in self.in_flight.moving() {
            if self.may_hand_over(state, r)? {
                return Ok(Some(r));
            }
        }
        Ok(None)
    }

    /// Takes the physical chunk of `from` (which [`Tiers::may_hand_over`]) for `to`, a chunk
    /// coming in (not from the file). Returns it with the fence the copy into it waits for.
    pub(crate) fn take_over(
        &mut self,
        state: &mut ChunkTable,
        from: ChunkRef,
        to: ChunkRef,
    ) -> (PhysHandle, Arc<Fence>) {
        debug_assert!(!matches!(state.chunk(to).location(), Location::File(_)), "the file reader would not wait");
        let last_use = Arc::clone(state.chunk(from).busy().expect("a chunk that may hand over has a last use"));
        self.in_flight.stop_moving(&last_use, from);
        self.counters.handovers += 1;
        (state.hand_over(from), last_use)
    }

    /// Returns physical chunks taken for a page-in that will not happen to the pool; those
    /// handed over by chunks still leaving go back once their last uses are done (the host
    /// waits: this is a failure path).
    pub(crate) fn give_back(&mut self, phys: Vec<PhysHandle>, after: &[Arc<Fence>], more: Vec<Option<PhysHandle>>) {
        for fence in after {
            let _ = fence.wait();
        }
        phys.into_iter().chain(more.into_iter().flatten()).for_each(|p| self.pool.give(p));
    }
}
