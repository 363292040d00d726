//! Working sets in turns (`hbm_sharing = "working-sets"`; by default, `auto`, on a GPU whose
//! tenants can all wait, each of a job of its own: `in_turns`), the registry's part.
//!
//! When the working sets of a GPU's working tenants do not all fit, fair share has every one of
//! them page the part it lacks through the same link, so all run at the link's pace. With
//! `working-sets` the daemon instead admits as many whole working sets as fit
//! (`tiermem_policy::admission`): an admitted tenant's budget is its whole demand, and the
//! others keep what they hold acquired and room for their next acquire (twice their largest),
//! sharing the rest by weight. The order of admission: priority; then the tenants whose turn
//! has not run out (`turn_ms`), the longest-running first (a turn is never taken over by one
//! that began later); then least time admitted while others waited, per unit of weight (time
//! alone, or while everything fits, does not count, and a turn starts when others come;
//! counted from the least of the GPU's working tenants for a newcomer, as CFS places a task at
//! its run queue's least virtual runtime: from zero, a program coming beside two that had
//! taken turns for an hour would have had turn after turn for half an hour); then the oldest.
//! So a turn ends after `turn_ms` when another tenant waits, and the one that waited longest
//! goes next. When no working set fits and every other working tenant can wait (below),
//! the first in that order is admitted all the same with what the others' keeps leave: the
//! GPU in turns, each program beyond its budget alone on it in its turn, rather than all of
//! them reading their data in place at once. A ramping tenant is not held at its whole part
//! here (its demand is what admission needs). `tiermem status` marks a working tenant not
//! admitted while another is `WAIT`.
//!
//! # Holding the waiting
//! A tenant kept to a little while it waits still runs, paging what it lacks. An engine pages
//! its own working set and slows only itself and the link. A program under `tiermem run` reads
//! what lies beyond its budget in place, over PCIe, in long kernels — and while another
//! process's kernels do that, the driver's remapping for the admitted tenant's moves costs
//! ~20× more (4.6–9.1 ms per 32 MiB against 0.1–0.4, measured on the H200: BENCHMARKS.md,
//! forty-first session), so both crawl. Such a tenant registers `waits`, and is told to `wait`
//! (its budget's word) while it waits — if its turn can come ("Where the line stops") — and
//! while its own turn has begun but the tenant whose turn ended is still giving back the
//! memory it is to get: its budget below its target and below its demand (a program whose
//! working set fits what it has runs on), while another
//! tenant of its GPU holds more than its budget (a cut not yet met, or one whose deadline
//! passed and whose tenant still reports more in use). It launches nothing meanwhile, and its
//! silence is not taken for idleness. The hold ends with the wait, or when the memory is given
//! back (at the latest five of the daemon's `deadline_ms` after the turn began); that time is
//! not counted as its turn (on the H200 a turn ran out while its program waited for the
//! other's 10 s of host chunks made for the shed, forty-second session).
//!
//! A held tenant keeps only what it must (its keep; headroom would go to waste), so it gives
//! back all the rest in one cut, and the admitted tenant, whose demand grows as it runs (a
//! program allocates as it goes), grows into it without another cut — each of which would hold
//! it again while it is met (on the H200 a hand-over took ~12 s that way).
//!
//! # Where the line stops
//! Admission goes down the order, but not past a tenant that is ramping up (its demand still
//! growing: registry.rs, "Tenants ramping up"): admitted beside it on what it does not use
//! yet, the others would be cut as it grows, and it held meanwhile while they give that memory
//! back. On the H200 every run of two programs began so: the newcomer, admitted on the first
//! one's unused memory, ran its first step into it and was cut, the first held ~3 s while it
//! sent 5.5 GiB down; with each larger than the GPU's share, the first, grown past the share,
//! lost its turn to the newcomer (whose demand was still small), sent 11 GiB down and waited
//! 30 s (forty-fourth session). Nor past a tenant whose turn is under way but that no longer
//! fits (it grew), when all the others can wait: it keeps its turn, beyond its fit
//! (`admit_beyond`), rather than see a later one that happens to fit take it over. When some
//! cannot wait (engines), the one that fits runs. Nor past the first in the order (whose
//! turn it is) when it does not fit and all the others can wait: passed over for a later one
//! that fits, a program larger than the GPU beside a small one waited, held, as long as the
//! small one worked — for ever, the small one taking turn after turn; it has the GPU in its
//! turn as if none fit. Nor past the first whose turn is next (none under way) and that can
//! run in a turn (it fits beside the others' keeps, or they can all wait): when tenants fit
//! two by two their turns overlap, one of them always under way, and one that fits only alone
//! would never come first. A program is held only while its turn can come: beside an engine
//! (explicit `working-sets`), one that fits only beyond its share runs on what it keeps, as
//! the engine does. And a program that can wait but has not begun to work takes none of the
//! spare while another is admitted (the admitted one's budget would trail its allocations,
//! those beyond it made on the host and brought up later). A property test
//! (`crates/daemon/tests/turns_properties.rs`) checks, under both sharings, that after any
//! sequence every program is let go within a few turns for each.
//!
//! # Handing over
//! A turn that runs out ends in a cut to the tenant's keep, met by sending its working set
//! down. A program that fit until then has no host memory to send it into, and the driver
//! makes it then, while neither program runs: ~10 s for 16 GiB on the H200 (forty-second
//! session). So a `waits` tenant in a turn that runs out is told that `others_wait` while
//! another of its GPU waits for the GPU, and makes that room ahead, during its turn. Not
//! before half its turn has run: making host memory slows the program's own launches about
//! as long as it takes (~4 s for 10 GiB on the H200, forty-third session), which the first
//! half of a turn, where the program brings its working set back up, can least afford; and a
//! program that ends within its turn then makes none for nothing. Half of a 30 s turn leaves
//! 15 s, twice what 16 GiB took.

use super::{Registry, Tenant, TenantId};
use crate::config::Sharing;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use tiermem_policy::admission::{admit, admit_beyond, fits_alone, with_admitted};
use tiermem_policy::share::Claim;
use tiermem_protocol::Tier;

/// A turn's beginning is held while memory is made room for it at most this many of the
/// daemon's `deadline_ms` (10 s by default).
const ROOM_WAIT_DEADLINES: u64 = 5;

/// The job a tenant belongs to: the `tiermem run` its process runs under (`register`'s `job`)
/// within its cgroup, else its process alone.
fn job_of(t: &Tenant) -> (Option<&str>, Result<u32, u32>) {
    (t.who.cgroup.as_deref(), t.job.ok_or(t.who.pid))
}

/// What a tenant's budget says beyond its bytes (protocol: `budget`'s `wait` and `others_wait`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Words {
    pub held: bool,
    pub others_wait: bool,
}

impl Registry {
    /// Whether GPU `gpu`'s tenants share its HBM in turns (`hbm_sharing`): always with
    /// `working-sets`, never with `fair`; with `auto` while every tenant of the GPU can wait for
    /// its turn and belongs to a job of its own that has no tenant on another GPU ("In turns by
    /// default"): processes of one job may wait on each other (NCCL ranks, a producer and its
    /// consumer), so turns that hold one while another of its job has the GPU, here or on
    /// another GPU whose turns need not line up with this one's, would stall them both. As of
    /// the last rebalance ([`Registry::note_turn_taking`]).
    pub(super) fn in_turns(&self, gpu: u32) -> bool {
        self.gpus_in_turns.contains(&gpu)
    }

    /// Which GPUs' tenants take turns now, in one pass over the tenants; each change under
    /// `auto` is kept for the daemon's log. Called at the start of every rebalance.
    pub(super) fn note_turn_taking(&mut self) {
        let gpus = self.tenants.values().map(|t| t.gpu.index);
        let now: BTreeSet<u32> = match self.config.hbm_sharing {
            Sharing::Fair => BTreeSet::new(),
            Sharing::WorkingSets => gpus.collect(),
            Sharing::Auto => {
                let mut gpus_of_job: BTreeMap<_, BTreeSet<u32>> = BTreeMap::new();
                let mut on_gpu: BTreeMap<_, usize> = BTreeMap::new();
                for t in self.tenants.values() {
                    gpus_of_job.entry(job_of(t)).or_default().insert(t.gpu.index);
                    *on_gpu.entry((job_of(t), t.gpu.index)).or_default() += 1;
                }
                let mut in_turns: BTreeSet<u32> = gpus.collect();
                for t in self.tenants.values() {
                    let alone = gpus_of_job[&job_of(t)].len() == 1 && on_gpu[&(job_of(t), t.gpu.index)] == 1;
                    if !(t.waits && alone) {
                        in_turns.remove(&t.gpu.index);
                    }
                }
                in_turns
            }
        };
        if self.config.hbm_sharing == Sharing::Auto {
            // Said once two tenants share a GPU: alone, one has it all either way (a data-parallel
            // job's rank registering a moment before the other ranks would flicker in the log).
            let mut tenants_on: BTreeMap<u32, usize> = BTreeMap::new();
            self.tenants.values().for_each(|t| *tenants_on.entry(t.gpu.index).or_default() += 1);
            for (gpu, _) in tenants_on.into_iter().filter(|&(_, n)| n >= 2) {
                let in_turns = now.contains(&gpu);
                if self.sharing_said.insert(gpu, in_turns) != Some(in_turns) {
                    self.sharing_changes.push((gpu, in_turns));
                }
            }
        }
        self.gpus_in_turns = now;
    }

    /// `ids`, a GPU's tenants, share its HBM fairly (not in turns, or no longer: a tenant that
    /// cannot wait came): no turn, no one waiting.
    pub(super) fn out_of_turns(&mut self, ids: &[TenantId]) {
        for id in ids {
            let tenant = self.tenants.get_mut(id).expect("a tenant");
            (tenant.turn_since, tenant.waiting, tenant.sticky) = (None, false, false);
        }
    }

    /// Working sets in turns: admits whole working sets among `ids` (a GPU's tenants, with
    /// their `claims` in units and overhead `charges`), records who is in a turn, and returns
    /// the claims that fair share then divides the GPU by (module documentation).
    pub(super) fn admit_working_sets(
        &mut self,
        capacity: u64,
        ids: &[TenantId],
        claims: &[Claim],
        charges: &[u64],
        unit: u64,
        now: Instant,
    ) -> Vec<Claim> {
        // Time in a turn counts only while others wait: a tenant alone, or among tenants that
        // all fit, is served nothing and its turn starts when others come.
        let contended = ids.iter().any(|id| self.tenants[id].waiting);
        // A turn held while room is made for it has not begun for its tenant: that time is
        // neither served nor counted against the turn ("Holding the waiting").
        for id in ids {
            let tenant = self.tenants.get_mut(id).expect("a tenant");
            if tenant.turn_since.is_some() {
                let elapsed = now.saturating_duration_since(tenant.accrued_at);
                // Uncontended, every turn starts afresh, a held one's too: a newcomer admitted
                // beside the incumbent while making room would otherwise hold the older turn
                // and go first, before the incumbent (then cut by a stop at the newcomer).
                match (contended, tenant.held && !tenant.waiting) {
                    (false, _) => (tenant.turn_since, tenant.room_held) = (Some(now), Duration::ZERO),
                    (true, true) => tenant.room_held += elapsed,
                    (true, false) => tenant.served += elapsed,
                }
            }
            tenant.accrued_at = now;
        }
        self.lift_to_served_floor(ids);
        let tenants: Vec<&Tenant> = ids.iter().map(|id| &self.tenants[id]).collect();
        // What a tenant not admitted keeps beyond its floor: room for twice its largest acquire.
        let keep: Vec<u64> = tenants
            .iter()
            .zip(claims.iter().zip(charges))
            .map(|(t, (c, &charge))| match working(t) {
                true => c.floor.max((2 * t.transfers.largest_acquire_bytes).div_ceil(unit).max(1) + charge),
                false => c.floor,
            })
            .collect();
        // Priority; then turns under way, the oldest first (a turn is never taken over by a
        // later one); then least served, the oldest tenant first.
        let mut order: Vec<usize> = (0..ids.len()).filter(|&i| working(tenants[i])).collect();
        order.sort_by_key(|&i| {
            let t = tenants[i];
            let turn = t.turn_since.filter(|_| self.is_sticky(t, now));
            (std::cmp::Reverse(t.rule.priority), turn.is_none(), turn, served(t), ids[i])
        });
        let mut admitted = admit(capacity, claims, &keep, &order);
        // The line stops ("Where the line stops") at a tenant ramping up, and at the first not
        // admitted that can run in a turn: one whose turn is under way but that no longer fits
        // while all the others can wait, or one whose turn is next (none under way) that fits
        // with the others at their keeps or for whom all the others can wait (it then has the
        // GPU alone, below). None after it is admitted: passed, it could wait for ever — beside
        // a smaller program that fits, or while the turns of tenants that fit two by two
        // overlap. (One that can never run in a turn is passed: it would hold the line for
        // nothing.)
        let can_wait: Vec<bool> = tenants.iter().map(|t| t.waits).collect();
        let others_wait = |i: usize| order.iter().all(|&j| j == i || can_wait[j]);
        let stops = |i: usize| {
            let can_run =
                others_wait(i) || (!self.is_sticky(tenants[i], now) && fits_alone(capacity, claims, &keep, i));
            tenants[i].ramping || (!admitted[i] && can_run)
        };
        if let Some(at) = order.iter().position(|&i| stops(i)) {
            order[at + 1..].iter().for_each(|&j| admitted[j] = false);
        }
        // None fits, and all but the first can wait: the first runs beyond its fit, in turns.
        let mut claims = claims.to_vec();
        if let Some((i, demand)) = admit_beyond(capacity, &claims, &keep, &order, &can_wait, &admitted) {
            (claims[i].demand, admitted[i]) = (demand, true);
        }
        // Waiting: working, not admitted, while another is (a lone tenant too large to be
        // admitted has the GPU to itself; so do tenants none of which fits).
        let any_admitted = admitted.iter().any(|&a| a);
        let waiting: Vec<bool> = (0..ids.len()).map(|i| any_admitted && working(tenants[i]) && !admitted[i]).collect();
        // Held only while its turn can come: where every working tenant can wait (the first
        // in the order then runs, fitting or not), or where it fits with the others at their
        // keeps. Beside one that cannot wait (an engine, under explicit `working-sets`), a
        // program that fits only beyond its whole share would never run again; it runs on what
        // it keeps, as the engine does.
        let all_wait = order.iter().all(|&i| can_wait[i]);
        let holdable: Vec<bool> = (0..ids.len()).map(|i| all_wait || fits_alone(capacity, &claims, &keep, i)).collect();
        let held: Vec<bool> = (0..ids.len()).map(|i| waiting[i] && tenants[i].waits && holdable[i]).collect();
        let unstarted: Vec<bool> = tenants.iter().map(|t| t.waits && !t.idle && !working(t)).collect();
        let contended = waiting.iter().any(|&w| w);
        for (i, id) in ids.iter().enumerate() {
            let tenant = self.tenants.get_mut(id).expect("a tenant");
            match (admitted[i], tenant.turn_since.is_some()) {
                (true, false) => {
                    (tenant.turn_since, tenant.room_held) = (Some(now), Duration::ZERO);
                    // Logged when others wait (while everything fits, every tenant is admitted).
                    if contended {
                        self.turns.push((*id, true));
                    }
                }
                (false, true) => {
                    tenant.turn_since = None;
                    self.turns.push((*id, false));
                }
                _ => {}
            }
            (tenant.waiting, tenant.holdable) = (waiting[i], holdable[i]);
        }
        for id in ids {
            let sticky = self.is_sticky(&self.tenants[id], now);
            self.tenants.get_mut(id).expect("a tenant").sticky = sticky;
        }
        // A held tenant runs nothing: what is spare goes to the admitted ones, and the held one
        // gives everything beyond its keep back in one cut (spread to it, the spare would be
        // taken back cut by cut as the admitted tenant's demand grows, each cut holding the
        // admitted one while it is met: "Holding the waiting").
        // So does a program that can wait but has not begun to work (no demand reported yet)
        // while another is admitted: spread to it, the spare would leave the admitted one,
        // still setting up, a budget that trails its allocations — those beyond it made on the
        // host and brought up at its next pauses (on the H200 a program's first two steps took
        // 3.2 and 2.6 s against 0.75 and 0.23 so) — and the newcomer, once it works, waits
        // for its turn anyway unless it fits, when it is admitted at its first report.
        let mut claims = with_admitted(&claims, &keep, &admitted);
        for (i, claim) in claims.iter_mut().enumerate() {
            if held[i] || (any_admitted && unstarted[i]) {
                claim.quota = Some(claim.floor);
            }
        }
        claims
    }

    /// Service counts from the GPU's floor, as a CFS run queue's virtual runtime does: a
    /// working tenant below it (a newcomer, one back from idling) is raised to it, and it rises
    /// with the least served of the working tenants (`ids`, a GPU's). Counted from zero, a
    /// program coming beside programs that had taken turns for an hour would take turn after
    /// turn until it had been served as long, every other held meanwhile.
    fn lift_to_served_floor(&mut self, ids: &[TenantId]) {
        let Some(gpu) = ids.first().map(|id| self.tenants[id].gpu.index) else { return };
        let floor = self.served_floor.get(&gpu).copied().unwrap_or(0);
        for id in ids {
            let tenant = self.tenants.get_mut(id).expect("a tenant");
            if working(tenant) && served(tenant) < floor {
                let nanos = floor * u128::from(tenant.rule.weight.max(1));
                tenant.served = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
            }
        }
        if let Some(least) = ids.iter().map(|id| &self.tenants[id]).filter(|t| working(t)).map(served).min() {
            self.served_floor.insert(gpu, floor.max(least));
        }
    }

    /// Every tenant, and what its budget is to say (module documentation, "Holding the
    /// waiting" and "Handing over").
    pub(super) fn words(&self, now: Instant) -> Vec<(TenantId, Words)> {
        // Memory that does not come back (a tenant that cannot give it) holds a turn up no
        // longer than this.
        let room_wait = Duration::from_millis(ROOM_WAIT_DEADLINES * self.config.deadline_ms);
        let others = |gpu: u32, except: TenantId, what: &dyn Fn(&Tenant) -> bool| {
            self.tenants.iter().any(|(&id, t)| id != except && t.gpu.index == gpu && what(t))
        };
        let shedding = |t: &Tenant| t.tiers[&Tier::Hbm].holding > t.tiers[&Tier::Hbm].budget;
        let held = |id: TenantId, t: &Tenant| {
            let hbm = &t.tiers[&Tier::Hbm];
            let begun = t.turn_since.is_some_and(|since| now.saturating_duration_since(since) < room_wait);
            let lacking = hbm.budget < hbm.target.min(hbm.usage.demand);
            let making_room = begun && lacking && others(t.gpu.index, id, &shedding);
            self.in_turns(t.gpu.index) && t.waits && t.holdable && (t.waiting || making_room)
        };
        // In the second half of a turn that runs out, with another waiting for the GPU.
        let half_turn = Duration::from_millis(self.config.turn_ms) / 2;
        let others_wait = |t: &Tenant| t.waits && self.turn_left(t, now).is_some_and(|left| left <= half_turn);
        self.tenants.iter().map(|(&id, t)| (id, Words { held: held(id, t), others_wait: others_wait(t) })).collect()
    }

    /// In a turn with its whole working set that has not run out (`turn_ms`, less the time it
    /// was held while room was made for it; 0: turns never run out).
    pub(super) fn is_sticky(&self, tenant: &Tenant, now: Instant) -> bool {
        let turn = Duration::from_millis(self.config.turn_ms);
        self.turn_ran(tenant, now).is_some_and(|ran| self.config.turn_ms == 0 || ran < turn)
    }

    /// Of a turn that runs out while another tenant of its GPU waits, the time left (none:
    /// no such turn).
    pub(super) fn turn_left(&self, tenant: &Tenant, now: Instant) -> Option<Duration> {
        let in_turns = self.in_turns(tenant.gpu.index) && self.config.turn_ms > 0;
        let contended = self.tenants.values().any(|t| t.gpu.index == tenant.gpu.index && t.waiting);
        let turn = Duration::from_millis(self.config.turn_ms);
        let ran = self.turn_ran(tenant, now).filter(|_| in_turns && contended)?;
        Some(turn.saturating_sub(ran))
    }

    /// How long the tenant's turn has run, less the time it was held while room was made for
    /// it; none if it has no turn.
    fn turn_ran(&self, tenant: &Tenant, now: Instant) -> Option<Duration> {
        tenant.turn_since.map(|since| now.saturating_duration_since(since).saturating_sub(tenant.room_held))
    }
}

/// Working: not idle, and with a demand of HBM reported.
fn working(t: &Tenant) -> bool {
    !t.idle && t.reported && t.tiers[&Tier::Hbm].usage.demand > 0
}

/// Time admitted while others waited, per unit of weight (nanoseconds).
fn served(t: &Tenant) -> u128 {
    t.served.as_nanos() / u128::from(t.rule.weight.max(1))
}
