//! What the registry shows: the status report (`tiermem status`, `top`, the metrics), each
//! viewer seeing what its uid and the configuration allow.

use super::{Registry, Tenant, TenantId, TierSlot};
use crate::census::Ledger;
use std::time::Instant;
use tiermem_protocol::{PoolStatus, ShareStatus, StatusReport, TenantStatus, Tier};

impl Registry {
    /// What `viewer` may see: everything for root, the daemon's user, a public status or a
    /// tenant whose rule says `see_all`; otherwise the tenants of its own uid.
    pub fn status(&self, viewer_uid: u32, viewer: Option<TenantId>, now: Instant) -> StatusReport {
        let sees_all = viewer_uid == 0
            || viewer_uid == self.daemon_uid
            || self.config.status.public
            || viewer.and_then(|id| self.tenants.get(&id)).is_some_and(|t| t.rule.see_all);
        let visible = |t: &Tenant| sees_all || t.who.uid == viewer_uid;
        let ms = |since: Instant| now.saturating_duration_since(since).as_millis() as u64;
        let pools = self
            .pools()
            .into_iter()
            .map(|(pool, capacity)| {
                let ids = self.members(pool);
                let slots: Vec<(TenantId, &Tenant, &TierSlot)> =
                    ids.iter().map(|id| (*id, &self.tenants[id], &self.tenants[id].tiers[&pool.tier])).collect();
                PoolStatus {
                    tier: pool.tier,
                    gpu: pool.gpu,
                    capacity,
                    budgeted: slots.iter().map(|(_, _, s)| s.budget).sum(),
                    used: slots.iter().fold(0, |total: u64, (_, _, s)| total.saturating_add(s.usage.used)),
                    shares: slots
                        .iter()
                        .filter(|(_, t, _)| visible(t))
                        .map(|&(tenant, _, s)| ShareStatus {
                            tenant,
                            used: s.usage.used,
                            acquired: s.usage.acquired,
                            demand: s.usage.demand,
                            budget: s.budget,
                            target: s.target,
                            entitled: s.entitled,
                            lent: s.entitled.saturating_sub(s.share),
                            borrowed: s.share.saturating_sub(s.entitled),
                            reserved: s.usage.reserved,
                        })
                        .collect(),
                    driver: match pool.tier {
                        Tier::Hbm => pool.gpu.and_then(|gpu| self.ledgers.get(&gpu)).map(Ledger::accounts),
                        _ => None,
                    },
                    // Alone, a tenant has it all either way: said once two share the GPU.
                    in_turns: pool.tier == Tier::Hbm
                        && slots.len() >= 2
                        && pool.gpu.is_some_and(|gpu| self.in_turns(gpu)),
                }
            })
            .collect();
        let tenants: Vec<TenantStatus> = self
            .tenants
            .iter()
            .filter(|(_, t)| visible(t))
            .map(|(&tenant, t)| TenantStatus {
                tenant,
                name: t.rule.name.clone(),
                pid: t.who.pid,
                uid: t.who.uid,
                cgroup: t.who.cgroup.clone(),
                label: t.who.label.clone(),
                gpu: t.gpu.index,
                job: t.job,
                weight: t.rule.weight,
                priority: t.rule.priority,
                connected_ms: ms(t.connected),
                late: t.late,
                idle: t.idle,
                ramping: t.ramping,
                waiting: t.waiting,
                held: t.held,
                turn_left_ms: self.turn_left(t, now).map(|left| left.as_millis() as u64),
                overhead: self.ledgers.get(&t.gpu.index).and_then(|l| l.overhead(t.who.pid)),
                host_pinned: t.tiers.get(&Tier::Host).map_or(0, |s| s.usage.used.saturating_add(s.usage.reserved)),
                host_ready: t.tiers.get(&Tier::Host).map_or(0, |s| s.usage.reserved),
                transfers: t.transfers,
            })
            .collect();
        StatusReport {
            daemon: crate::DAEMON_NAME.to_owned(),
            uptime_ms: ms(self.started),
            hidden_tenants: (self.tenants.len() - tenants.len()) as u32,
            pools,
            tenants,
            lenders: Vec::new(),
        }
    }
}
