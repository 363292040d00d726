//! Helpers of the registry's tests (no sockets): a GPU, identities, the budgets an outbox
//! gives, demand reports.

#![allow(dead_code)] // each test file uses some of these

use std::time::Instant;
use tiermem_daemon::config::Identity;
use tiermem_daemon::registry::{Joining, Outbox, Registry, TenantId};
use tiermem_protocol::{DaemonMessage, GpuId, Tier, TierBytes, TierUsage, TransferCounters};

pub const MIB: u64 = 1 << 20;
pub const CHUNK: u64 = 2 * MIB;

pub fn gpu() -> GpuId {
    GpuId { index: 0, uuid: None, total_bytes: 1 << 30, simulated: true }
}

pub fn who(uid: u32, label: Option<&str>) -> Identity {
    Identity { uid, pid: 100 + uid, cgroup: None, label: label.map(str::to_owned) }
}

/// The HBM budget (bytes, target) each message gives, by tenant; the last one wins.
pub fn budgets(outbox: &Outbox) -> Vec<(TenantId, u64, u64, u64)> {
    outbox
        .iter()
        .filter_map(|(id, m)| match m {
            DaemonMessage::Budget { seq, tiers, .. } => {
                tiers.iter().find(|t| t.tier == Tier::Hbm).map(|t| (*id, *seq, t.bytes, t.target))
            }
            _ => None,
        })
        .collect()
}

pub fn demand(bytes: u64) -> [(Tier, TierUsage); 4] {
    let hbm = TierUsage { used: 0, acquired: 0, demand: bytes, reserved: 0 };
    [
        (Tier::Hbm, hbm),
        (Tier::Peer, TierUsage::default()),
        (Tier::Host, TierUsage::default()),
        (Tier::File, TierUsage::default()),
    ]
}

pub fn register(r: &mut Registry, uid: u32, label: Option<&str>, now: Instant) -> (TenantId, Outbox) {
    let (id, _, outbox) = r.register(who(uid, label), joining(gpu(), &[], &[]), now);
    (id, outbox)
}

/// A tenant of `gpu` with chunks of `CHUNK`, wanting `wants` and holding `held`, that cannot wait.
pub fn joining<'a>(gpu: GpuId, wants: &'a [TierBytes], held: &'a [TierBytes]) -> Joining<'a> {
    Joining { gpu, chunk_bytes: CHUNK, wants, held, waits: false, job: None }
}

/// `id` has made `acquires` acquires of 20 MiB so far (it is working, not idle).
pub fn acquiring(r: &mut Registry, id: TenantId, acquires: u64, now: Instant) {
    r.record_transfers(id, TransferCounters { acquires, largest_acquire_bytes: 20 * MIB, ..Default::default() }, now);
}
