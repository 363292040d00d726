//! Host budgets: the node daemon's share of the host's pinned memory, applied while the
//! program runs.
//!
//! The daemon shares the node's pinned host memory among its tenants as it shares each GPU's
//! HBM (`[tiers] host` in its config); a tenant's engine meets its share here. What is in use
//! beyond the new budget leaves the host tier: first the host copies of chunks that are also
//! resident in HBM (spares: dropping them loses nothing), then the coldest chunks whose only
//! copy is on the host, spilled to the file tier by the engine's policy (in the background,
//! waited for with the lock released). Without a file tier such chunks stay, and the budget
//! is met as they leave (a page-in brings them up; nothing new is pinned meanwhile). Then
//! wholly free slabs at the end of the host tier are unpinned: the memory goes back to the
//! operating system, not merely to the engine (slabs are up to 1 GiB: host_tier.rs). A larger
//! budget lets the tier grow again, up to the engine's own cap, pinning as it goes.
//!
//! A budget never goes below [`HOST_FLOOR`] chunks: chunks leave HBM for the file only
//! through the host tier (a copy down, then a write), and a chunk whose only copy is in HBM
//! could never be evicted with no host slot at all.

use crate::engine::{Engine, Inner};
use crate::error::{retag, Context};
use crate::Result;

/// The fewest chunks a host budget leaves: the way from HBM to the file (module docs).
pub const HOST_FLOOR: usize = 4;

impl Inner {
    /// Applies a host budget of `bytes` (module docs); returns the bytes unpinned.
    pub(crate) fn set_host_budget(&mut self, bytes: usize) -> Result<usize> {
        let call = "set_host_budget";
        self.tiers.host.set_budget((bytes / self.tiers.chunk).max(HOST_FLOOR));
        self.tiers.reap(&mut self.state)?;
        let excess = self.tiers.host.excess();
        if excess > 0 {
            self.tiers.reclaim_host_copies(&mut self.state, excess);
        }
        let excess = self.tiers.host.excess();
        if excess > 0 {
            self.spill_to_file(call, excess)?;
        }
        self.tiers.host.unpin_spare(self.tiers.device.as_ref()).during(call)
    }
}

impl Engine {
    /// Holds the host tier to `bytes` of pinned memory from now on (at most the engine's own
    /// host cap, at least [`HOST_FLOOR`] chunks): what is in use beyond it moves out, spilling to the file tier, and pinned
    /// memory no longer needed is unpinned (host_budget.rs). Returns the bytes unpinned. The
    /// node daemon's tenant link calls this with the tenant's share of the host's memory.
    pub fn set_host_budget(&self, bytes: usize) -> Result<usize> {
        self.unlocked_waits(|inner| inner.set_host_budget(bytes)).map_err(|e| retag(e, "set_host_budget"))
    }
}
