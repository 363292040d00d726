//! Helpers of the registry's tests (no sockets): a GPU, identities, the budgets an outbox
//! gives, demand reports, programs under `tiermem run`, budgets met until they settle.

#![allow(dead_code)] // each test file uses some of these

use std::collections::BTreeMap;
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

/// Meets every cut in `outbox` and whatever follows, until no budget changes; returns each
/// tenant's last budget (bytes).
pub fn settle(r: &mut Registry, outbox: Outbox, now: Instant) -> BTreeMap<TenantId, u64> {
    settle_seeing(r, outbox, now, |_| {})
}

/// [`settle`], showing `seen` each outbox on the way.
pub fn settle_seeing(
    r: &mut Registry,
    mut outbox: Outbox,
    now: Instant,
    mut seen: impl FnMut(&Outbox),
) -> BTreeMap<TenantId, u64> {
    let mut last = BTreeMap::new();
    for _ in 0..32 {
        seen(&outbox);
        let sent = budgets(&outbox);
        if sent.is_empty() {
            return last;
        }
        outbox = Vec::new();
        for (id, seq, bytes, _) in sent {
            last.insert(id, bytes);
            outbox.extend(r.budget_met(id, seq, now));
        }
    }
    panic!("budgets did not settle")
}

/// The tenants held (told to wait: they launch nothing).
pub fn held(r: &Registry, now: Instant) -> Vec<TenantId> {
    r.status(0, None, now).tenants.iter().filter(|t| t.held).map(|t| t.tenant).collect()
}

/// A program under `tiermem run` (it can wait) working over `mib` MiB.
pub fn program(r: &mut Registry, uid: u32, mib: u64, now: Instant) -> (TenantId, Outbox) {
    program_of_job(r, uid, mib, None, now)
}

/// [`program`], of the `tiermem run` whose pid is `job`.
pub fn program_of_job(r: &mut Registry, uid: u32, mib: u64, job: Option<u32>, now: Instant) -> (TenantId, Outbox) {
    let joining = Joining { gpu: gpu(), chunk_bytes: CHUNK, wants: &[], held: &[], waits: true, job };
    let (id, _, mut outbox) = r.register(who(uid, None), joining, now);
    acquiring(r, id, 1, now);
    outbox.extend(r.usage(id, demand(mib * MIB), now));
    (id, outbox)
}
