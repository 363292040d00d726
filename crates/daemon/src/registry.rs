//! The daemon's state: the tenants, what each holds and may hold, and the budgets to send.
//! No sockets and no clock of its own (callers pass `now`): the server (server.rs) feeds it
//! events and delivers what it returns, so everything here is tested without a socket.
//!
//! # Pools and budgets
//! A *pool* is one tier of one GPU (HBM) or of the node (host, file: only when the config
//! gives them a capacity). After every event that can change a share (register, usage, a met
//! budget, a disconnect, a missed deadline) [`Registry::rebalance`] recomputes each pool's fair
//! shares (`tiermem_policy::share`, in whole chunks; what nobody demands is spread on top as
//! headroom, so that a tenant can grow without a round trip) and stages them: a tenant above its share
//! gets the smaller budget at once; one below grows only into memory no tenant may still be
//! holding. A tenant *holds* its budget in force; after a cut it still holds the old one until
//! it says the new one is met (`budget_met`) or its deadline passes (then it is marked late and
//! holds what it reports using). So the daemon never promises a byte twice, and a tenant that
//! leaves gives back everything at once.
//!
//! A GPU's capacity is at most what its driver's census leaves for the tenants' chunks
//! (census.rs): the GPU less other processes and less what tenant processes hold beyond their
//! chunks.
//!
//! # Idle tenants
//! A tenant whose acquire count has not moved for `idle_after_ms` while its reports kept
//! coming (at least every `USAGE_HEARTBEAT`) is *idle* — one not heard from that long is busy
//! or stalled, not idle: a tenant meeting a cut on its link's thread sends nothing meanwhile
//! (before the thirtieth session, pinning room ahead there too), and taking it for idle would
//! cut it to its largest acquire mid-job (the likely reason a victim of the hog benchmark fell
//! to 128 MiB, twenty-ninth session). In HBM its claim comes after every working tenant's
//! (their weights count `WORKING_FIRST` times its own), down to a floor of its largest
//! acquire. So what working tenants demand is lent to them out of its share (GDM §6: memory an
//! application does not touch serves the others), and what they do not demand it keeps:
//! nothing is taken from an idle tenant for nobody. Its next
//! acquire, which the floor lets through, is reported within 50 ms; the tenant works again
//! and its share comes back as the borrowers give it back (staged as any growth). Its data
//! meanwhile lives in the tiers below.
//!
//! # Tenants ramping up
//! A tenant is *ramping up* from its registration until its HBM demand has held still for
//! `ramp_ms`: meanwhile it demands its whole part, as it does before its first allocation, so
//! that what it does not use yet is not lent out and taken back piece by piece as it sets up —
//! every piece a cut, and a round of evictions, for the borrower. (A program starting beside a
//! running one took 10 → 16 → 15 → 14 → 13 → 12 GiB of the other's budget before this rule,
//! BENCHMARKS.md.) Then what it does not demand is lent in one step. Only once: a tenant that
//! has set up and grows a little later takes a little (reclaiming its whole part for a few
//! bytes would cut the borrower for nothing). An idle tenant lends whatever it demands.
//!
//! # Working sets in turns
//! In turns (`hbm_sharing = "working-sets"`, or by default among programs that can wait:
//! `auto`) whole working sets are admitted first: turns.rs.
//!
//! What tenants report is believed only as far as it cannot hurt the others: a floor (acquired
//! memory) counts only up to what the tenant was allowed to hold, and a late tenant is never
//! counted above what it held before the cut. A tenant that will not give back cannot be made
//! to (reclaim is cooperative), but it cannot take more than its budget either.

use crate::census::{Census, Ledger, MARGIN};
use crate::config::{Config, Identity, TenantRule};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use tiermem_policy::share::{fair_shares, spread_spare, stage_grants, Claim};
use tiermem_protocol::{DaemonMessage, GpuId, Tier, TierBudget, TierBytes, TierUsage, TransferCounters};

mod claims;
mod status;
mod turns;

use claims::charged;
use turns::Words;

pub type TenantId = u64;

/// Reclaim timings kept between two scrapes of the metrics (older ones are dropped).
const MAX_RECLAIMS_KEPT: usize = 4096;

/// One tenant's place in one tier.
#[derive(Debug, Clone, Copy, Default)]
struct TierSlot {
    usage: TierUsage,
    /// The budget last sent.
    budget: u64,
    /// What it is moving to: its fair share of what tenants demand, plus its part of what
    /// nobody demands (headroom, taken back first).
    target: u64,
    /// Its fair share of the demand alone, and its own part (if everyone wanted all).
    share: u64,
    entitled: u64,
    /// What it may hold now: the budget, or a larger old one until a cut is met.
    holding: u64,
    /// A cut not yet met: its sequence number, when it was sent and its deadline.
    pending: Option<Pending>,
    /// In a pool (the tier has a capacity): budgets are sent for it.
    pooled: bool,
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    seq: u64,
    sent: Instant,
    deadline: Instant,
    /// Bytes to give back.
    bytes: u64,
}

struct Tenant {
    who: Identity,
    transfers: TransferCounters,
    gpu: GpuId,
    chunk: u64,
    rule: TenantRule,
    /// The engine's own caps, never exceeded.
    wants: BTreeMap<Tier, u64>,
    /// Until the first usage report, demand is taken to be `wants`.
    reported: bool,
    tiers: BTreeMap<Tier, TierSlot>,
    seq: u64,
    connected: Instant,
    late: bool,
    /// When its acquire count last moved (or it registered), and when its last usage report
    /// came (or it registered).
    active_at: Instant,
    heard_at: Instant,
    /// Idle when shares were last computed (registry.rs, "Idle tenants").
    idle: bool,
    /// When its HBM demand last grew (or it registered), whether it was ramping up when shares
    /// were last computed, and whether it is done ramping up for good ("Tenants ramping up").
    grew_at: Instant,
    ramping: bool,
    ramped: bool,
    /// Working sets in turns (registry/turns.rs): since when its whole working set is admitted
    /// (none: it is not), the time it was admitted while others waited, up to `accrued_at`,
    /// and whether it was working but not admitted, or in a turn that had not run out, when
    /// shares were last computed.
    turn_since: Option<Instant>,
    served: Duration,
    /// Whether it may be held while it waits: its turn can come (turns.rs).
    holdable: bool,
    accrued_at: Instant,
    waiting: bool,
    sticky: bool,
    /// It can wait for its turn (registered `waits`: a program under `tiermem run`), and what
    /// the last budget sent told it: to wait (turns.rs, "Holding the waiting"), that others
    /// wait for its turn to end ("Handing over").
    waits: bool,
    held: bool,
    others_wait: bool,
    /// The `tiermem run` its process runs under, if any (`register`'s `job`).
    job: Option<u32>,
    /// Of its turn so far, the time it was held while room was made for it (not counted).
    room_held: Duration,
}

/// What a tenant asks for when it registers, besides who it is.
#[derive(Debug, Clone)]
pub struct Joining<'a> {
    pub gpu: GpuId,
    /// Its engine's chunk: budgets are whole chunks.
    pub chunk_bytes: u64,
    /// The caps it would use alone, and what it holds already (a reconnecting tenant).
    pub wants: &'a [TierBytes],
    pub held: &'a [TierBytes],
    /// It can wait for its turn ([`tiermem_protocol::ClientMessage::Register`]'s `waits`).
    pub waits: bool,
    /// The `tiermem run` its process runs under (`Register`'s `job`).
    pub job: Option<u32>,
}

/// Which pool: a tier, and the GPU for HBM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct PoolKey {
    tier: Tier,
    gpu: Option<u32>,
}

pub struct Registry {
    config: Config,
    started: Instant,
    tenants: BTreeMap<TenantId, Tenant>,
    next_id: TenantId,
    /// The daemon's own uid: it may see every tenant.
    daemon_uid: u32,
    /// Cuts met since [`Registry::take_reclaims`] last took them: bytes given back, and how long
    /// it took.
    reclaims: Vec<(u64, Duration)>,
    /// Per GPU index: the driver's censuses of it (census.rs).
    ledgers: BTreeMap<u32, Ledger>,
    /// Turns begun (true) and ended (false) since [`Registry::take_turns`] last took them.
    turns: Vec<(TenantId, bool)>,
    /// Tenants gone idle (true) or working again (false) since [`Registry::take_idles`].
    idles: Vec<(TenantId, bool)>,
    /// GPUs whose tenants share HBM in turns, and under `hbm_sharing = "auto"` those that went
    /// into turns (true) or out of them (false) since [`Registry::take_sharing_changes`], while
    /// shared by two tenants or more; what was last said of each.
    gpus_in_turns: BTreeSet<u32>,
    sharing_changes: Vec<(u32, bool)>,
    sharing_said: BTreeMap<u32, bool>,
    /// Per GPU index, the least service of its working tenants, per unit of weight (turns.rs).
    served_floor: BTreeMap<u32, u128>,
}

/// Messages to deliver, each to one tenant.
pub type Outbox = Vec<(TenantId, DaemonMessage)>;

impl Registry {
    pub fn new(config: Config, now: Instant, daemon_uid: u32) -> Self {
        let (tenants, reclaims, ledgers) = (BTreeMap::new(), Vec::new(), BTreeMap::new());
        Self {
            config,
            started: now,
            tenants,
            next_id: 1,
            daemon_uid,
            reclaims,
            ledgers,
            turns: Vec::new(),
            idles: Vec::new(),
            gpus_in_turns: BTreeSet::new(),
            sharing_changes: Vec::new(),
            sharing_said: BTreeMap::new(),
            served_floor: BTreeMap::new(),
        }
    }

    /// The user the daemon runs as.
    pub fn daemon_uid(&self) -> u32 {
        self.daemon_uid
    }

    /// The weight of tenant `id`'s rule (1 for a tenant that is not registered).
    pub fn weight_of(&self, id: TenantId) -> u32 {
        self.tenants.get(&id).map_or(1, |t| t.rule.weight)
    }

    pub fn tenant_count(&self) -> usize {
        self.tenants.len()
    }

    /// Makes a connection a tenant (`joining.held`: what it holds already, as after a daemon
    /// restart); returns its id, the name of the rule it matched, and the budgets that change
    /// (its first among them).
    pub fn register(&mut self, who: Identity, joining: Joining<'_>, now: Instant) -> (TenantId, String, Outbox) {
        let Joining { gpu, chunk_bytes, wants, held, waits, job } = joining;
        let id = self.next_id;
        self.next_id += 1;
        let rule = self.config.rule_for(&who).clone();
        let name = rule.name.clone();
        let tenant = Tenant {
            who,
            gpu,
            chunk: chunk_bytes.max(1),
            rule,
            wants: wants.iter().map(|w| (w.tier, w.bytes)).collect(),
            reported: false,
            // What it holds already is its until it gives it back, within its own caps.
            tiers: Tier::ALL
                .iter()
                .map(|&tier| {
                    let holds = |list: &[TierBytes]| list.iter().find(|h| h.tier == tier).map(|h| h.bytes);
                    let holding = holds(held).unwrap_or(0).min(holds(wants).unwrap_or(u64::MAX));
                    (tier, TierSlot { holding, ..TierSlot::default() })
                })
                .collect(),
            seq: 0,
            transfers: TransferCounters::default(),
            connected: now,
            late: false,
            active_at: now,
            heard_at: now,
            idle: false,
            grew_at: now,
            ramping: true,
            ramped: false,
            turn_since: None,
            served: Duration::ZERO,
            accrued_at: now,
            waiting: false,
            sticky: false,
            waits,
            held: false,
            holdable: true,
            others_wait: false,
            job,
            room_held: Duration::ZERO,
        };
        self.tenants.insert(id, tenant);
        (id, name, self.rebalance(now))
    }

    pub fn usage(&mut self, id: TenantId, usage: [(Tier, TierUsage); 4], now: Instant) -> Outbox {
        let Some(tenant) = self.tenants.get_mut(&id) else { return Vec::new() };
        tenant.reported = true;
        for (tier, u) in usage {
            if let Some(slot) = tenant.tiers.get_mut(&tier) {
                if tier == Tier::Hbm && u.demand > slot.usage.demand {
                    tenant.grew_at = now;
                }
                slot.usage = u;
                if slot.pending.is_none() && slot.holding > slot.budget {
                    // Late: it holds what it uses, down to its budget as it gives memory back.
                    slot.holding = slot.budget.max(u.used).min(slot.holding);
                }
            }
        }
        self.rebalance(now)
    }

    /// The tenant's transfer counters (for metrics, and its acquire count: whether it is idle;
    /// a share that changes with it changes at the next rebalance).
    pub fn record_transfers(&mut self, id: TenantId, transfers: TransferCounters, now: Instant) {
        if let Some(tenant) = self.tenants.get_mut(&id) {
            tenant.heard_at = now;
            if transfers.acquires != tenant.transfers.acquires {
                tenant.active_at = now;
            }
            tenant.transfers = transfers;
        }
    }

    /// The cuts met since the last call: bytes given back and how long it took.
    pub fn take_reclaims(&mut self) -> Vec<(u64, Duration)> {
        std::mem::take(&mut self.reclaims)
    }

    /// Working sets in turns: the turns begun (true) and ended (false) since the last call, for
    /// the log.
    pub fn take_turns(&mut self) -> Vec<(TenantId, bool)> {
        std::mem::take(&mut self.turns)
    }

    /// Under `hbm_sharing = "auto"`, GPUs gone into turns (true) or out of them (false) since
    /// the last call, for the log; said of a GPU once two tenants share it.
    pub fn take_sharing_changes(&mut self) -> Vec<(u32, bool)> {
        std::mem::take(&mut self.sharing_changes)
    }

    /// Tenants gone idle (true) or working again (false) since the last call, for the log.
    pub fn take_idles(&mut self) -> Vec<(TenantId, bool)> {
        std::mem::take(&mut self.idles)
    }

    /// Every tenant's transfer counters, by id.
    pub fn transfers(&self) -> Vec<(TenantId, TransferCounters)> {
        self.tenants.iter().map(|(&id, t)| (id, t.transfers)).collect()
    }

    /// The tenant met budget `seq`: what it held beyond it is free.
    pub fn budget_met(&mut self, id: TenantId, seq: u64, now: Instant) -> Outbox {
        let Some(tenant) = self.tenants.get_mut(&id) else { return Vec::new() };
        for slot in tenant.tiers.values_mut() {
            if let Some(pending) = slot.pending.filter(|p| p.seq <= seq) {
                if self.reclaims.len() < MAX_RECLAIMS_KEPT {
                    self.reclaims.push((pending.bytes, now.saturating_duration_since(pending.sent)));
                }
                slot.pending = None;
                slot.holding = slot.budget;
            }
        }
        if tenant.tiers.values().all(|s| s.pending.is_none()) {
            tenant.late = false;
        }
        self.rebalance(now)
    }

    /// The tenant is gone: everything it held is free at once.
    pub fn disconnect(&mut self, id: TenantId, now: Instant) -> Outbox {
        let Some(gone) = self.tenants.remove(&id) else { return Vec::new() };
        // The last tenant of a GPU takes its census along: the next one starts afresh.
        if !self.tenants.values().any(|t| t.gpu.index == gone.gpu.index) {
            self.ledgers.remove(&gone.gpu.index);
        }
        self.rebalance(now)
    }

    /// Cuts not met in time: the tenant is late and holds what it reports using. Returns the
    /// late tenants (for the log) and the budgets that change.
    pub fn expire_deadlines(&mut self, now: Instant) -> (Vec<TenantId>, Outbox) {
        let mut late = Vec::new();
        for (&id, tenant) in &mut self.tenants {
            for slot in tenant.tiers.values_mut() {
                if slot.pending.is_some_and(|p| p.deadline <= now) {
                    slot.pending = None;
                    slot.holding = slot.budget.max(slot.usage.used).min(slot.holding);
                    if !tenant.late {
                        late.push(id);
                    }
                    tenant.late = true;
                }
            }
        }
        let turned = self.tenants.values().any(|t| {
            t.idle != self.is_idle(t, now) || t.ramping != self.is_ramping(t, now) || t.sticky != self.is_sticky(t, now)
        });
        // A word a budget says changes with time too (half a turn run, a hold for room timed out).
        let reworded = || {
            self.words(now).into_iter().any(|(id, w)| {
                let t = &self.tenants[&id];
                (t.held, t.others_wait) != (w.held, w.others_wait)
            })
        };
        let turned = turned || reworded();
        let outbox = if late.is_empty() && !turned { Vec::new() } else { self.rebalance(now) };
        (late, outbox)
    }

    /// The GPUs a census is taken of: (index, UUID) of each real GPU with a tenant.
    pub fn census_gpus(&self) -> Vec<(u32, String)> {
        let mut gpus: Vec<(u32, String)> = self
            .tenants
            .values()
            .filter(|t| !t.gpu.simulated)
            .filter_map(|t| t.gpu.uuid.clone().map(|uuid| (t.gpu.index, uuid)))
            .collect();
        gpus.sort();
        gpus.dedup_by_key(|g| g.0);
        gpus
    }

    /// Takes the driver's census of GPU `index` into its ledger, and rebalances.
    pub fn record_census(&mut self, index: u32, census: &Census, now: Instant) -> Outbox {
        let mut chunks_by_pid: BTreeMap<u32, u64> = BTreeMap::new();
        for t in self.tenants.values().filter(|t| t.gpu.index == index) {
            *chunks_by_pid.entry(t.who.pid).or_default() += t.tiers[&Tier::Hbm].usage.used;
        }
        self.ledgers.entry(index).or_default().record(census, &chunks_by_pid);
        self.rebalance(now)
    }

    fn pools(&self) -> BTreeMap<PoolKey, u64> {
        let mut pools = BTreeMap::new();
        for t in self.tenants.values() {
            let configured = self.config.hbm_capacity(t.gpu.index, t.gpu.total_bytes, t.gpu.simulated);
            let counted = self.ledgers.get(&t.gpu.index).and_then(|l| l.capacity(MARGIN));
            let capacity = counted.map_or(configured, |c| c.min(configured));
            pools.entry(PoolKey { tier: Tier::Hbm, gpu: Some(t.gpu.index) }).or_insert(capacity);
        }
        for tier in [Tier::Peer, Tier::Host, Tier::File] {
            if let Some(capacity) = self.config.node_capacity(tier) {
                pools.insert(PoolKey { tier, gpu: None }, capacity);
            }
        }
        pools
    }

    fn members(&self, pool: PoolKey) -> Vec<TenantId> {
        self.tenants.iter().filter(|(_, t)| pool.gpu.is_none_or(|gpu| t.gpu.index == gpu)).map(|(&id, _)| id).collect()
    }

    /// Recomputes every pool's shares and stages the budgets; returns the budget messages of
    /// the tenants whose budget or target changed.
    pub fn rebalance(&mut self, now: Instant) -> Outbox {
        self.note_turn_taking();
        // A tenant held for its turn launches nothing: that is not idleness (turns.rs).
        for tenant in self.tenants.values_mut().filter(|t| t.held) {
            tenant.active_at = now;
        }
        let states: Vec<(TenantId, bool, bool)> =
            self.tenants.iter().map(|(&id, t)| (id, self.is_idle(t, now), self.is_ramping(t, now))).collect();
        for (id, idle, ramping) in states {
            let tenant = self.tenants.get_mut(&id).expect("a tenant");
            if tenant.idle != idle {
                self.idles.push((id, idle));
            }
            (tenant.idle, tenant.ramping) = (idle, ramping);
            tenant.ramped |= !ramping;
        }
        let mut changed: BTreeMap<TenantId, ()> = BTreeMap::new();
        for (pool, capacity) in self.pools() {
            let ids = self.members(pool);
            // Budgets are whole units: the largest chunk among the pool's tenants.
            let unit = ids.iter().map(|id| self.tenants[id].chunk).max().unwrap_or(1);
            // Each tenant's overhead (the census: its process's memory beyond its chunks) is
            // shared out as part of its own share and charged to it (census.rs).
            let charges = self.overhead_charges(pool, &ids, unit);
            let capacity = capacity + charges.iter().sum::<u64>() * unit;
            let mut claims: Vec<Claim> = ids
                .iter()
                .zip(&charges)
                .map(|(id, &charge)| charged(self.claim(&self.tenants[id], pool.tier, unit), charge))
                .collect();
            match (pool.tier, pool.gpu) {
                (Tier::Hbm, Some(gpu)) if self.in_turns(gpu) => {
                    claims = self.admit_working_sets(capacity / unit, &ids, &claims, &charges, unit, now);
                }
                (Tier::Hbm, Some(_)) => self.out_of_turns(&ids),
                _ => {}
            }
            let shares = fair_shares(capacity / unit, &claims);
            // A tenant's own part (what it lends or borrows against) is by its configured
            // weight, whether or not it works now: an idle tenant lends, it does not borrow.
            // Only an idle tenant makes the claims' weights differ from the configured ones.
            let own = match pool.tier == Tier::Hbm && ids.iter().any(|id| self.tenants[id].idle) {
                true => {
                    let by_rule =
                        ids.iter().zip(&claims).map(|(id, c)| Claim { weight: self.tenants[id].rule.weight, ..*c });
                    fair_shares(capacity / unit, &by_rule.collect::<Vec<_>>())
                }
                false => shares.clone(),
            };
            let holding: Vec<u64> = ids
                .iter()
                .zip(&charges)
                .map(|(id, charge)| self.tenants[id].tiers[&pool.tier].holding.div_ceil(unit) + charge)
                .collect();
            let spare = spread_spare(capacity / unit, &claims, &shares);
            let targets: Vec<u64> = shares.iter().zip(&spare).map(|(s, x)| s.budget + x).collect();
            let granted = stage_grants(capacity / unit, &targets, &holding);
            for (i, id) in ids.iter().enumerate() {
                let Some(slot) = self.tenants.get_mut(id).and_then(|t| t.tiers.get_mut(&pool.tier)) else { continue };
                let chunks = |units: u64| units.saturating_sub(charges[i]) * unit;
                let (budget, target) = (chunks(granted[i]), chunks(targets[i]));
                slot.entitled = chunks(own[i].entitled);
                slot.share = chunks(shares[i].budget);
                if !slot.pooled || budget != slot.budget || target != slot.target {
                    changed.insert(*id, ());
                }
                slot.pooled = true;
                slot.budget = budget;
                slot.target = target;
            }
        }
        let deadline = Duration::from_millis(self.config.deadline_ms);
        for &id in changed.keys() {
            let Some(tenant) = self.tenants.get_mut(&id) else { continue };
            tenant.seq += 1;
            let seq = tenant.seq;
            for slot in tenant.tiers.values_mut().filter(|s| s.pooled) {
                if slot.budget >= slot.holding {
                    slot.holding = slot.budget;
                    slot.pending = None;
                } else {
                    let sent = slot.pending.map_or(now, |p| p.sent);
                    let bytes = slot.holding - slot.budget;
                    slot.pending = Some(Pending { seq, sent, deadline: now + deadline, bytes });
                }
            }
        }
        // A tenant told to wait or that others wait, or no longer, is sent its budget again
        // with the words.
        for (id, Words { held, others_wait }) in self.words(now) {
            let tenant = self.tenants.get_mut(&id).expect("a tenant");
            if (tenant.held, tenant.others_wait) != (held, others_wait) && changed.insert(id, ()).is_none() {
                tenant.seq += 1;
            }
            (tenant.held, tenant.others_wait) = (held, others_wait);
        }
        let mut outbox = Vec::new();
        for id in changed.into_keys() {
            let Some(tenant) = self.tenants.get(&id) else { continue };
            let tiers = tenant
                .tiers
                .iter()
                .filter(|(_, s)| s.pooled)
                .map(|(&tier, slot)| TierBudget { tier, bytes: slot.budget, target: slot.target })
                .collect();
            let (seq, wait, others_wait, deadline_ms) =
                (tenant.seq, tenant.held, tenant.others_wait, self.config.deadline_ms);
            outbox.push((id, DaemonMessage::Budget { seq, tiers, deadline_ms, wait, others_wait }));
        }
        outbox
    }
}
