//! Hand-overs: a dirty chunk leaving HBM gives its physical chunk to the chunk coming in at
//! once, and the copy coming in waits for the copy going down on the GPU, not on the host.
//!
//! A dirty chunk leaves HBM through a copy to a host slot. Before hand-overs, a call that
//! needed its physical chunk (a demand making room, a page-ahead, a streamed chunk coming
//! home) waited on the host for that copy, then queued the copy in: every such chunk cost the
//! host one copy down in series with the program's own host work (2.4 ms for 128 MiB), and
//! a writer whose new bytes must push old ones out (a training step's forward pass saving
//! activations) ran the copies down and its kernels one after the other. Now the chunk leaves
//! HBM at once ([`ChunkTable::hand_over`](crate::state::ChunkTable::hand_over)), its physical
//! chunk goes back to the pool with the copy's fence (`InFlight::hand_over`), and whoever
//! takes it has its copy in wait for that fence on the device (movement.rs,
//! `behind_moves_down`: `cuStreamWaitEvent`; a read from the file waits on the host). Until
//! the copy ends the chunk is `landing` (state.rs): a page-in of it waits for the copy on the
//! device, and unmapping its address, freeing its buffer, writing its slot to the file or
//! discarding it waits on the host (or retires the slot behind the copy).
//!
//! **Where.** Two callers hand over, where it was measured to pay on the H200 (forty-ninth and
//! fiftieth sessions, `bench/results/probes-20261130e/` and `…f/`):
//! * a streamed chunk coming *home* (homes.rs) sends the dirty holder of its physical chunk
//!   away (`send_away`): a loop streaming dirty buffers with 2 ms of host work between
//!   acquires ran 1.47× faster;
//! * **zero fills**: a demand or a page-ahead whose chunks all come in as zeros (never written,
//!   or discarded — a forward pass saving activations into the buffers of the last step's)
//!   takes the physical chunks of dirty chunks already on their way to the host
//!   (`hand_over_moving`) and hands its own victims over: beside a resident model, a forward
//!   pass that pushed 10.7 GB of activations out took 0.24 s against 0.32–0.38.
//!   A chunk *copied* in does not: its copy up, ordered behind copies down on the GPU rather
//!   than issued once they landed, made a link-bound loop of dirty buffers 22% slower.
//!
//! Only copies to the host hand over. A clean chunk leaving waits only for the GPU's last use
//! of it, which no copy stands between: handing those over too (twelfth and twenty-sixth
//! sessions, and the forty-ninth) gained nothing and cost a read-only loop one chunk more a
//! pass on the H200. A copy into a neighbour's HBM is waited for as before.
//!
//! **Pacing.** Waiting for the copies kept the program (the host) at most a window ahead of the
//! GPU: the page-ahead follows the host's acquires, and it is the GPU that frees the chunks.
//! Unpaced, a program with no host work between its acquires ran far ahead and streamed
//! 5–15% slower on the H200 (the page-ahead then placed chunks for steps the GPU was far
//! from). So a hand-over first waits for the oldest moves handed over before it until at most
//! [`HANDED_AHEAD`] of them still run; a program whose host work takes longer than its moves
//! waits for nothing, and a call that hands nothing over (a read-only loop, a swap) waits
//! for none of them.

use crate::engine::Inner;
use crate::error::Context;
use crate::fence::Fence;
use crate::state::ChunkRef;
use crate::Result;
use std::collections::HashSet;
use std::sync::Arc;

/// Chunks handed over whose moves down still run, at most, when a hand-over begins
/// ("Pacing"). On the H200 (`bench/results/probes-20261130e/`), waiting for all of them cost a
/// fully offloaded training step 0.60 s against 0.55 s, none of them made a lone link-bound
/// loop 5–15% slower than before hand-overs, and 256 MiB matched both (three tenants at once
/// ~10% faster than before).
const HANDED_AHEAD: usize = 256 << 20;

impl Inner {
    /// Sends `victims` (sorted) down so that chunks coming in now can take their physical
    /// chunks: the dirty ones copied to the host hand theirs over at once, the others (clean
    /// ones behind the GPU's last use, copies to a neighbour) are waited for.
    pub(crate) fn send_away(&mut self, call: &'static str, victims: &[ChunkRef]) -> Result<()> {
        if victims.iter().any(|&v| !self.state.chunk(v).is_clean()) {
            self.pace_hand_overs(call)?;
        }
        self.send_victims_down(call, victims)?;
        self.hand_over(victims);
        let mut fences: Vec<Arc<Fence>> = Vec::new();
        for &v in victims {
            if let Some(fence) = self.state.chunk(v).leaving() {
                if !fences.iter().any(|f| Arc::ptr_eq(f, fence)) {
                    fences.push(Arc::clone(fence));
                }
            }
        }
        self.wait_for(call, fences)?;
        self.tiers.reap(&mut self.state)
    }

    /// Hands over up to `count` chunks already on their way to the host (sent down by an
    /// earlier page-ahead or eviction), none of `protect` (sorted). Returns how many: those
    /// that landed while the pacing waited free their room themselves.
    pub(crate) fn hand_over_moving(&mut self, call: &'static str, count: usize, protect: &[ChunkRef]) -> Result<usize> {
        let mut seen = HashSet::new();
        let movers: Vec<ChunkRef> = self
            .tiers
            .in_flight
            .chunks_moving()
            .filter(|&r| {
                let moving = self.state.buffer(r.0).is_some_and(|b| b.chunks()[r.1].copying_to_host().is_some());
                moving && protect.binary_search(&r).is_err() && seen.insert(r)
            })
            .take(count)
            .collect();
        if movers.is_empty() {
            return Ok(0);
        }
        self.pace_hand_overs(call)?;
        self.tiers.reap(&mut self.state)?;
        Ok(self.hand_over(&movers))
    }

    /// Hands over those of `refs` whose move down is a copy to the host. Returns how many.
    fn hand_over(&mut self, refs: &[ChunkRef]) -> usize {
        let mut handed = 0;
        for &r in refs {
            if self.state.chunk(r).copying_to_host().is_some() {
                let (phys, fence) = self.state.hand_over(r);
                self.tiers.pool.give(phys);
                self.tiers.in_flight.hand_over(fence, phys);
                handed += 1;
            }
        }
        self.tiers.counters.handed_over += handed as u64;
        handed
    }

    /// Waits for the oldest moves handed over until at most [`HANDED_AHEAD`] of them run.
    fn pace_hand_overs(&mut self, call: &'static str) -> Result<()> {
        let ahead = HANDED_AHEAD / self.tiers.chunk;
        let earlier = self.tiers.in_flight.handed_moves_beyond(ahead).during(call)?;
        self.wait_for(call, earlier)
    }
}
