//! What each tenant claims of a pool when its shares are computed (`Registry::rebalance`): its
//! demand, floor, quota and weight as the registry's rules make them ("Idle tenants", "Tenants
//! ramping up" in the registry's documentation), and the process overhead charged to it.

use super::{PoolKey, Registry, Tenant, TenantId};
use crate::census::MARGIN;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tiermem_policy::share::Claim;
use tiermem_protocol::{Tier, USAGE_HEARTBEAT};

/// How much a working tenant's weight counts over an idle one's in HBM ("Idle tenants").
const WORKING_FIRST: u32 = 1 << 10;

/// `claim` with `charge` units held beyond its chunks (its process's overhead): demand, floor
/// and quota grow by it, so the share water-filled for it covers both.
pub(super) fn charged(claim: Claim, charge: u64) -> Claim {
    Claim {
        demand: claim.demand.saturating_add(charge),
        floor: claim.floor + charge,
        quota: claim.quota.map(|q| q.saturating_add(charge)),
        ..claim
    }
}

impl Registry {
    /// The units of process overhead each of `ids` (the members of `pool`) is charged: in the
    /// HBM of a GPU where a census has measured it and the driver's count, not the configured
    /// capacity, is what limits the chunks (only then do overheads take memory the chunks
    /// could have had); a process's overhead split evenly among its tenants. Zero elsewhere.
    pub(super) fn overhead_charges(&self, pool: PoolKey, ids: &[TenantId], unit: u64) -> Vec<u64> {
        let ledger = match (pool.tier, pool.gpu, ids.first()) {
            (Tier::Hbm, Some(gpu), Some(first)) => {
                let g = &self.tenants[first].gpu;
                let configured = self.config.hbm_capacity(gpu, g.total_bytes, g.simulated);
                self.ledgers.get(&gpu).filter(|l| l.capacity(MARGIN).is_some_and(|c| c < configured))
            }
            _ => None,
        };
        let Some(ledger) = ledger else { return vec![0; ids.len()] };
        let mut tenants_of: BTreeMap<u32, u64> = BTreeMap::new();
        for id in ids {
            *tenants_of.entry(self.tenants[id].who.pid).or_default() += 1;
        }
        ids.iter()
            .map(|id| {
                let pid = self.tenants[id].who.pid;
                ledger.charge(pid).map_or(0, |overhead| overhead.div_ceil(unit).div_ceil(tenants_of[&pid]))
            })
            .collect()
    }

    pub(super) fn is_idle(&self, tenant: &Tenant, now: Instant) -> bool {
        let after = Duration::from_millis(self.config.idle_after_ms);
        // Silence is not idleness: a tenant's reports come at least every heartbeat, so one not
        // heard from is busy (meeting a cut) or stalled, and keeps its claim.
        let silent = now.saturating_duration_since(tenant.heard_at) >= after.max(2 * USAGE_HEARTBEAT);
        self.config.idle_after_ms > 0 && now.saturating_duration_since(tenant.active_at) >= after && !silent
    }

    pub(super) fn is_ramping(&self, tenant: &Tenant, now: Instant) -> bool {
        !tenant.ramped && now.saturating_duration_since(tenant.grew_at) < Duration::from_millis(self.config.ramp_ms)
    }

    pub(super) fn claim(&self, tenant: &Tenant, tier: Tier, unit: u64) -> Claim {
        let slot = &tenant.tiers[&tier];
        let want = tenant.wants.get(&tier).copied();
        // Until it reports a use, a tenant demands what it would use alone; in HBM, until it
        // has allocated something: a tenant that just arrived keeps its share while it sets
        // up, rather than give it to a hog and wait for it back chunk by chunk as it allocates
        // (a tenant that never allocates goes idle and lends it, see "Idle tenants").
        // A working tenant ramping up keeps its part too (see "Tenants ramping up").
        let in_turns = self.in_turns(tenant.gpu.index);
        let ramping = tier == Tier::Hbm && tenant.ramping && !tenant.idle && !in_turns;
        let reported = tenant.reported && (tier != Tier::Hbm || slot.usage.demand > 0) && !ramping;
        let demand = match reported {
            true => slot.usage.demand,
            false => want.unwrap_or(u64::MAX),
        };
        // Neighbours' HBM holds what does not fit a tenant's own. While its HBM grant is staged
        // (others still giving back), its report counts against the budget it has now and
        // claims neighbours' memory it will not need once the grant reaches its target — and
        // the others' peer budgets were cut for it, then grown back (on the H200 pair a
        // newcomer's arrival took a training loop's from 6 to 3 GiB, then back to 4).
        let demand = match (tier, tenant.tiers.get(&Tier::Hbm)) {
            (Tier::Peer, Some(hbm)) if reported && hbm.pooled && hbm.usage.demand > 0 && hbm.target > hbm.budget => {
                demand.min(hbm.usage.demand.saturating_sub(hbm.target))
            }
            _ => demand,
        };
        let quota = [tenant.rule.quota.get(&tier).map(|s| s.0), want].into_iter().flatten().min();
        // A tenant's word on what it holds acquired cannot pin more than it was allowed to hold.
        let floor = slot.usage.acquired.min(slot.usage.used).min(slot.holding);
        // An idle tenant's HBM comes after every working tenant's, down to its largest acquire
        // (see "Idle tenants").
        let (weight, floor) = match (tier == Tier::Hbm, tenant.idle) {
            (true, true) => (tenant.rule.weight, floor.max(tenant.transfers.largest_acquire_bytes.min(slot.holding))),
            (true, false) => (tenant.rule.weight.max(1).saturating_mul(WORKING_FIRST), floor),
            (false, _) => (tenant.rule.weight, floor),
        };
        Claim {
            weight,
            demand: demand.div_ceil(unit),
            floor: floor.div_ceil(unit),
            quota: quota.map(|q| q / unit),
            priority: tenant.rule.priority,
        }
    }
}
