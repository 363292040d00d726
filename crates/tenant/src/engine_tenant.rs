//! Every [`Leaseholder`] (an engine, or what owns one) is a [`Tenant`]: it registers the
//! engine's GPU, reports the engine's statistics, meets budgets through the engine (or its
//! owner's override), and maps slabs that other processes lend when it has neighbours to reach.

use crate::{Leaseholder, Registration, Tenant, Usage};
use tiermem::{Engine, Stats};
use tiermem_protocol::{GpuId, Tier, TierBytes, TierUsage, TransferCounters};

impl<L: Leaseholder> Tenant for L {
    /// A linked engine's acquire that does not fit its budget waits for it to grow.
    fn linking(&self) {
        self.engine().wait_for_budget(crate::BUDGET_WAIT);
    }

    fn registration(&self) -> Registration {
        let engine = self.engine();
        // Slabs lent in an earlier session have ids this daemon (maybe a restarted one) does
        // not know: give them back, and be lent afresh.
        if let Err(e) = engine.return_lent_slabs(&engine.lent_slabs()) {
            eprintln!("tiermem: daemon link: giving back slabs lent before: {e}");
        }
        let info = engine.device_info();
        Registration {
            gpu: GpuId {
                index: info.ordinal as u32,
                uuid: info.uuid.clone(),
                total_bytes: info.total_bytes as u64,
                simulated: info.backend == tiermem::mechanism::BackendKind::Sim,
            },
            chunk_bytes: engine.chunk_size() as u64,
            wants: vec![
                TierBytes { tier: Tier::Hbm, bytes: self.wants_hbm() },
                TierBytes { tier: Tier::Peer, bytes: engine.peer_offered() as u64 },
            ],
            held: vec![TierBytes {
                tier: Tier::Hbm,
                bytes: engine.summary().tiers[tiermem::Tier::Hbm].used_bytes as u64,
            }],
            lent_slab_bytes: borrows_lent(engine).then(|| engine.peer_slab_bytes() as u64),
            // An engine's owner runs the GPU work, not the engine: it cannot be held.
            waits: false,
        }
    }

    fn usage(&self) -> Usage {
        let engine = self.engine();
        let stats = engine.summary();
        (usage_of(&stats, engine.peer_offered() as u64, borrows_lent(engine)), transfers_of(&stats))
    }

    fn meet_budget(&self, tier: Tier, bytes: u64) -> Result<(), String> {
        match tier {
            Tier::Hbm => self.meet_hbm_budget(bytes),
            // What it may borrow from neighbours (a pool the daemon shares out).
            Tier::Peer => self.meet_peer_budget(bytes),
            // Its share of the node's pinned host memory (`[tiers] host`).
            Tier::Host => self.meet_host_budget(bytes),
            Tier::File => Ok(()),
        }
    }

    /// Pins a slab of room to evict into when HBM holds more without a copy below than is free.
    fn ready_for_cuts(&self) {
        if let Err(e) = self.engine().pin_room_to_evict() {
            eprintln!("tiermem: daemon link: no more host memory pinned ahead of budget cuts: {e}");
        }
    }

    fn lender(&self) -> Option<&Engine> {
        Some(self.engine()).filter(|engine| borrows_lent(engine))
    }
}

/// Whether the engine maps slabs lent by other processes: it has neighbours it can reach.
fn borrows_lent(engine: &Engine) -> bool {
    !engine.device_info().peers.is_empty()
}

/// What the engine holds, per tier (HBM, peer, host, file), as the daemon counts it. What it
/// would borrow from neighbours if it could: what does not fit its HBM, up to what its
/// lenders offered (`peer_offered`), or all of it where lenders of other processes may lend
/// (`accepts_lent`).
pub(crate) fn usage_of(stats: &Stats, peer_offered: u64, accepts_lent: bool) -> [TierUsage; 4] {
    let chunk = stats.chunk_size as u64;
    let (acquired, allocated) = (stats.acquired_in_hbm as u64 * chunk, stats.allocated_chunks as u64 * chunk);
    let hbm = TierUsage { used: stats.tiers[Tier::Hbm].used_bytes as u64, acquired, demand: allocated, reserved: 0 };
    let host_used = stats.tiers[Tier::Host].used_bytes as u64;
    // Pinned beyond what holds chunks: room to evict into, pinned ahead of a budget cut.
    let reserved = (stats.host_pinned_bytes as u64).saturating_sub(host_used);
    let host = TierUsage { used: host_used, acquired: 0, demand: host_used, reserved };
    let file_used = stats.tiers.get(Tier::File).map_or(0, |f| f.used_bytes as u64);
    let file = TierUsage { used: file_used, acquired: 0, demand: file_used, reserved: 0 };
    let peer_used = stats.tiers.get(Tier::Peer).map_or(0, |p| p.used_bytes as u64);
    let beyond_hbm = allocated.saturating_sub(stats.tiers[Tier::Hbm].capacity_bytes as u64);
    let borrowable = if accepts_lent { beyond_hbm } else { beyond_hbm.min(peer_offered) };
    let peer = TierUsage { used: peer_used, acquired: 0, demand: borrowable.max(peer_used), reserved: 0 };
    [hbm, peer, host, file]
}

pub(crate) fn transfers_of(stats: &Stats) -> TransferCounters {
    TransferCounters {
        bytes_in: stats.bytes_in,
        bytes_out: stats.bytes_out,
        evictions: stats.transfers.evictions,
        stall_us: (stats.transfers.stall_ms * 1000.0) as u64,
        acquires: stats.transfers.acquires,
        largest_acquire_bytes: stats.transfers.largest_acquire * stats.chunk_size as u64,
        launches: 0,
        launches_all_in_hbm: 0,
    }
}
