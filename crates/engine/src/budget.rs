//! The HBM budget, which may shrink or grow while the engine runs.
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

use crate::engine::Inner;
use crate::error::Context;
use crate::eviction::Among;
use crate::fence::Fence;
use crate::state::ChunkRef;
use crate::sync::Arc;
use crate::{Error, Result};
use std::collections::HashSet;
use tiermem_mechanism::PhysHandle;

impl Inner {
    /// Sets the HBM budget to `bytes` (whole chunks, rounded down) and starts sending down what
    /// exceeds it. Returns the fences of those copies.
    pub(crate) fn set_hbm_budget(&mut self, bytes: usize) -> Result<Vec<Arc<Fence>>> {
        let call = "set_hbm_budget";
        let total = self.device.info().total_bytes;
        if bytes > total {
            return Err(Error::Config(format!(
                "{call}: {bytes} bytes is more than the GPU's {total} bytes of memory; ask for at most that"
            )));
        }
        self.pool.set_cap(bytes / self.chunk);
        self.reap()?;
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
        let excess = self.pool.excess();
        excess > 0 && excess > self.moving_down()
    }

    fn moving_down(&self) -> usize {
        self.in_flight.chunks_moving_down()
    }

    /// Sends down, without waiting, as many unacquired resident chunks as the pool holds beyond
    /// the budget (less those already moving down): those of `first` (chunks just released),
    /// then the policy's choice.
    pub(crate) fn shed_excess(&mut self, call: &'static str, first: &[ChunkRef]) -> Result<Vec<Arc<Fence>>> {
        let need = self.pool.excess().saturating_sub(self.moving_down());
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

    /// Gives idle physical chunks back to the driver until no more than `limit` exist (or no
    /// idle one is left); stale mappings of them are unmapped first. Returns how many.
    pub(crate) fn release_idle_beyond(&mut self, call: &'static str, limit: usize) -> Result<usize> {
        let chunks = self.pool.take_idle(self.pool.releasable(limit));
        if chunks.is_empty() {
            return Ok(0);
        }
        let released = self.release_chunks(&chunks);
        let count = *released.as_ref().unwrap_or(&0);
        released.during(call).map(|_| count)
    }

    /// Unmaps the stale mappings of `chunks` (taken from the idle pool) and releases them; on a
    /// failure the chunks not yet released go back to the pool. Returns how many were released.
    fn release_chunks(&mut self, chunks: &[PhysHandle]) -> std::result::Result<usize, tiermem_mechanism::DeviceError> {
        let g = self.chunk;
        let idle: HashSet<PhysHandle> = chunks.iter().copied().collect();
        let stale: Vec<ChunkRef> =
            self.state.chunks().filter(|(_, c)| c.alias().is_some_and(|p| idle.contains(&p))).map(|(r, _)| r).collect();
        let mut outcome = Ok(());
        for r in stale {
            outcome = self.device.unmap(self.state.va(r), g);
            if outcome.is_err() {
                break;
            }
            self.state.unmapped(r);
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
}
