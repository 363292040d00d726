//! HBM lent between processes: which lender's slabs go to which tenant, and when they come
//! back. Pure bookkeeping (no sockets, no descriptors): the server (server.rs) carries out the
//! [`Action`]s, passing each slab's memory as a file descriptor.
//!
//! A **lender** (`tiermem lend --gpu N`) is a process holding a GPU's spare HBM: it makes a
//! slab when asked, exports it (`cuMemExportToShareableHandle`) and keeps its handle until
//! told to release it. A **borrower** is a tenant that registered with a slab size: it maps
//! the slabs it is lent into its peer tier. The memory of a slab is freed only when both have
//! let go, so giving it back is cooperative:
//!
//! ```text
//!   (none) ──make──▶ Making ──lender sent it──▶ Lent ──return asked──▶ Returning
//!                      │ borrower gone              │ borrower returned     │ returned, or borrower gone
//!                      ▼                            ▼                       ▼
//!                   released                     released ◀─────────────────┘
//! ```
//!
//! **Who gets what.** A borrower wants what does not fit its HBM (its usage report), in
//! whole slabs. Slabs go one at a time to the borrower holding least *for its weight* (its
//! tenant's `weight`: held ÷ weight) among those that want more and can reach a lender with
//! room (not on its own GPU): weighted max-min fairness, slab by slab, as the daemon shares
//! HBM. When no lender has room, a borrower that would still hold at least as much for its
//! weight after giving a slab to one that wants more (`(held − slab) ÷ weight ≥ (other's held +
//! its slab) ÷ its weight`) gives one back, and first one holding more than it now wants; so
//! holdings converge to shares of what is lent in proportion to the weights, each capped by
//! its want. A
//! lender whose offer falls below what it has lent (its GPU's own work needs memory) gets the
//! difference back, from the borrower holding most of it first.
//!
//! **Escalation.** A slab asked back must be returned within `return_deadline_ms`. One that
//! is not makes the daemon escalate as configured: `kill` ends the borrower (`SIGKILL`; the
//! driver then unmaps its memory, and the lender gets it back when the connection closes) or
//! `log` only says so, leaving the lender short until the borrower answers.

use crate::registry::TenantId;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tiermem_protocol::LenderStatus;

pub type LenderId = u64;
pub type SlabId = u64;

/// What the daemon does with a borrower that does not return a slab in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Escalate {
    /// `SIGKILL` the borrower's process.
    #[default]
    Kill,
    /// Log it and wait.
    Log,
}

/// `[lending]` in the daemon's config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LendingConfig {
    /// How long a borrower has to return a slab asked back.
    #[serde(default = "default_return_deadline_ms")]
    pub return_deadline_ms: u64,
    #[serde(default)]
    pub escalate: Escalate,
    /// Users whose processes may lend (a lender's memory is mapped by others, so a lender must
    /// be trusted): root and the daemon's own user always may.
    #[serde(default)]
    pub lender_uids: Vec<u32>,
}

fn default_return_deadline_ms() -> u64 {
    5000
}

impl Default for LendingConfig {
    fn default() -> Self {
        Self {
            return_deadline_ms: default_return_deadline_ms(),
            escalate: Escalate::default(),
            lender_uids: Vec::new(),
        }
    }
}

/// What the server is to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Ask `lender` for these slabs.
    Make { lender: LenderId, ids: Vec<SlabId>, slab_bytes: u64 },
    /// Send the slabs `ids` (their descriptors, from the lender's answer) to `borrower`.
    Lend { borrower: TenantId, gpu: u32, slab_bytes: u64, ids: Vec<SlabId> },
    /// Ask `borrower` to give these back.
    Return { borrower: TenantId, ids: Vec<SlabId>, deadline_ms: u64 },
    /// Tell `lender` to release these.
    Release { lender: LenderId, ids: Vec<SlabId> },
    /// `borrower` (process `pid`) kept slabs past their deadline: escalate.
    Late { borrower: TenantId, pid: u32, ids: Vec<SlabId>, kill: bool },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Making,
    Lent,
    Returning { deadline: Instant, escalated: bool },
}

#[derive(Debug, Clone)]
struct Slab {
    lender: LenderId,
    borrower: Option<TenantId>,
    bytes: u64,
    stage: Stage,
}

#[derive(Debug, Clone)]
struct Lender {
    pid: u32,
    gpu: u32,
    offer: u64,
    /// Gone: its slabs are asked back, and nothing new is made there.
    gone: bool,
}

#[derive(Debug, Clone)]
struct Borrower {
    pid: u32,
    gpu: u32,
    slab_bytes: u64,
    /// Its tenant's weight (at least 1): shares of what is lent are in proportion to it.
    weight: u64,
    want: u64,
    /// Lenders whose slabs it gave back unasked: it cannot map them (no peer access to that
    /// GPU, say), so it is lent none of theirs again.
    refused: Vec<LenderId>,
}

#[derive(Debug, Default)]
pub struct Lending {
    config: LendingConfig,
    lenders: BTreeMap<LenderId, Lender>,
    borrowers: BTreeMap<TenantId, Borrower>,
    slabs: BTreeMap<SlabId, Slab>,
    next_lender: LenderId,
    next_slab: SlabId,
}

impl Lending {
    pub fn new(config: LendingConfig) -> Self {
        Self { config, next_lender: 1, next_slab: 1, ..Self::default() }
    }

    /// Whether processes of `uid` may lend (`daemon_uid`: the daemon's own user).
    pub fn may_lend(&self, uid: u32, daemon_uid: u32) -> bool {
        uid == 0 || uid == daemon_uid || self.config.lender_uids.contains(&uid)
    }

    pub fn add_lender(&mut self, pid: u32, gpu: u32, offer: u64, now: Instant) -> (LenderId, Vec<Action>) {
        let id = self.next_lender;
        self.next_lender += 1;
        self.lenders.insert(id, Lender { pid, gpu, offer, gone: false });
        (id, self.rebalance(now))
    }

    pub fn set_offer(&mut self, lender: LenderId, offer: u64, now: Instant) -> Vec<Action> {
        if let Some(l) = self.lenders.get_mut(&lender) {
            l.offer = offer;
        }
        self.rebalance(now)
    }

    /// A lender's connection closed: its slabs not yet sent are dropped (the process's exit
    /// released them), those lent are asked back (their memory lives while a borrower maps it).
    pub fn remove_lender(&mut self, lender: LenderId, now: Instant) -> Vec<Action> {
        let Some(l) = self.lenders.get_mut(&lender) else { return Vec::new() };
        l.gone = true;
        l.offer = 0;
        self.slabs.retain(|_, s| !(s.lender == lender && s.stage == Stage::Making));
        let actions = self.rebalance(now);
        self.forget_lenders();
        actions
    }

    /// `borrower` (process `pid`, on GPU `gpu`, of tenant weight `weight`) maps lent slabs
    /// of `slab_bytes`.
    pub fn add_borrower(
        &mut self,
        borrower: TenantId,
        pid: u32,
        gpu: u32,
        slab_bytes: u64,
        weight: u32,
        now: Instant,
    ) -> Vec<Action> {
        if slab_bytes == 0 {
            return Vec::new();
        }
        let weight = u64::from(weight.max(1));
        self.borrowers.insert(borrower, Borrower { pid, gpu, slab_bytes, weight, want: 0, refused: Vec::new() });
        self.rebalance(now)
    }

    /// What `borrower` would borrow now (bytes beyond its HBM).
    pub fn set_want(&mut self, borrower: TenantId, want: u64, now: Instant) -> Vec<Action> {
        match self.borrowers.get_mut(&borrower) {
            Some(b) if b.want != want => b.want = want,
            _ => return Vec::new(),
        }
        self.rebalance(now)
    }

    /// A borrower's connection closed: the driver unmapped everything it had, so every slab
    /// it had (or was being made for it) goes back to its lender.
    pub fn remove_borrower(&mut self, borrower: TenantId, now: Instant) -> Vec<Action> {
        if self.borrowers.remove(&borrower).is_none() {
            return Vec::new();
        }
        let ids: Vec<SlabId> =
            self.slabs.iter().filter(|(_, s)| s.borrower == Some(borrower)).map(|(&id, _)| id).collect();
        let mut actions = Vec::new();
        for id in ids {
            let slab = self.slabs.get_mut(&id).expect("listed");
            slab.borrower = None;
            // One being made is released when the lender's answer comes (`made`).
            if slab.stage != Stage::Making {
                actions.extend(self.release(id));
            }
        }
        actions.extend(self.rebalance(now));
        actions
    }

    /// `lender` answered: `made` of the slabs it was asked for were made and are in the
    /// frame's descriptors, in this order; `failed` could not be (its GPU is short: it offers
    /// no more than it lends now). Returns what to do with each descriptor — a `Lend` to the
    /// borrower it was made for (ids in `made`'s order), or a `Release` (no one wants it any
    /// more) — and whatever rebalancing follows. Ids it was not asked for are an error.
    pub fn made(
        &mut self,
        lender: LenderId,
        made: &[SlabId],
        failed: &[SlabId],
        now: Instant,
    ) -> Result<Vec<Action>, String> {
        for id in made.iter().chain(failed) {
            if !self.slabs.get(id).is_some_and(|s| s.lender == lender && s.stage == Stage::Making) {
                return Err(format!("slabs: slab {id} was not asked of this lender, or was answered already"));
            }
        }
        if !failed.is_empty() {
            for id in failed {
                self.slabs.remove(id);
            }
            let lent = self.lent_by(lender);
            if let Some(l) = self.lenders.get_mut(&lender) {
                l.offer = l.offer.min(lent);
            }
        }
        let mut actions: Vec<Action> = Vec::new();
        let gpu = self.lenders.get(&lender).map_or(0, |l| l.gpu);
        for &id in made {
            let slab = self.slabs.get_mut(&id).expect("checked");
            slab.stage = Stage::Lent;
            match slab.borrower {
                Some(borrower) => {
                    match actions.iter_mut().find(|a| matches!(a, Action::Lend { borrower: b, .. } if *b == borrower)) {
                        Some(Action::Lend { ids, .. }) => ids.push(id),
                        _ => actions.push(Action::Lend { borrower, gpu, slab_bytes: slab.bytes, ids: vec![id] }),
                    }
                }
                None => actions.extend(self.release(id)),
            }
        }
        actions.extend(self.rebalance(now));
        Ok(actions)
    }

    /// `borrower` has let go of `ids` (asked or not). A slab given back unasked is one it could
    /// not map: it gets none of that lender's again. Ids it did not hold are ignored.
    pub fn returned(&mut self, borrower: TenantId, ids: &[SlabId], now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        for &id in ids {
            let Some(slab) = self.slabs.get(&id).filter(|s| s.borrower == Some(borrower) && s.stage != Stage::Making)
            else {
                continue;
            };
            if slab.stage == Stage::Lent {
                let lender = slab.lender;
                if let Some(b) = self.borrowers.get_mut(&borrower).filter(|b| !b.refused.contains(&lender)) {
                    b.refused.push(lender);
                }
            }
            actions.extend(self.release(id));
        }
        actions.extend(self.rebalance(now));
        actions
    }

    /// Slabs asked back whose deadline has passed: each late borrower once.
    pub fn expire(&mut self, now: Instant) -> Vec<Action> {
        let kill = self.config.escalate == Escalate::Kill;
        let mut late: BTreeMap<TenantId, Vec<SlabId>> = BTreeMap::new();
        for (&id, slab) in self.slabs.iter_mut() {
            if let (Stage::Returning { deadline, escalated: false }, Some(borrower)) = (slab.stage, slab.borrower) {
                if deadline <= now {
                    slab.stage = Stage::Returning { deadline, escalated: true };
                    late.entry(borrower).or_default().push(id);
                }
            }
        }
        late.into_iter()
            .map(|(borrower, ids)| {
                let pid = self.borrowers.get(&borrower).map_or(0, |b| b.pid);
                Action::Late { borrower, pid, ids, kill }
            })
            .collect()
    }

    pub fn status(&self) -> Vec<LenderStatus> {
        self.lenders
            .iter()
            .map(|(&id, l)| {
                let mut lent: BTreeMap<u64, u64> = BTreeMap::new();
                let mut returning = 0;
                for s in self.slabs.values().filter(|s| s.lender == id) {
                    match (s.stage, s.borrower) {
                        (Stage::Lent, Some(b)) => *lent.entry(b).or_default() += s.bytes,
                        (Stage::Returning { .. }, _) => returning += s.bytes,
                        _ => {}
                    }
                }
                LenderStatus {
                    lender: id,
                    pid: l.pid,
                    gpu: l.gpu,
                    offer: l.offer,
                    lent: lent.into_iter().collect(),
                    returning,
                }
            })
            .collect()
    }

    /// Bytes `borrower` maps or will (not counting slabs asked back).
    pub fn held_by(&self, borrower: TenantId) -> u64 {
        self.slabs.values().filter(|s| s.borrower == Some(borrower) && !s.returning()).map(|s| s.bytes).sum()
    }

    /// Bytes of `lender`'s that count against its offer (not counting slabs asked back).
    fn lent_by(&self, lender: LenderId) -> u64 {
        self.slabs.values().filter(|s| s.lender == lender && !s.returning()).map(|s| s.bytes).sum()
    }

    /// Slab `id` is back with its lender: tell it to release, unless it is gone (its exit
    /// released it already).
    fn release(&mut self, id: SlabId) -> Option<Action> {
        let slab = self.slabs.remove(&id)?;
        let gone = self.lenders.get(&slab.lender).is_none_or(|l| l.gone);
        self.forget_lenders();
        (!gone).then(|| Action::Release { lender: slab.lender, ids: vec![id] })
    }

    /// Lenders gone whose last slab is back.
    fn forget_lenders(&mut self) {
        let slabs = &self.slabs;
        self.lenders.retain(|&id, l| !l.gone || slabs.values().any(|s| s.lender == id));
    }

    /// Weighted max-min fair shares, one slab at a time (module docs).
    fn rebalance(&mut self, now: Instant) -> Vec<Action> {
        let mut actions = self.shrink_to_offers(now);
        // Grants, slab by slab, to the borrower holding least for its weight.
        let mut asks: BTreeMap<LenderId, (Vec<SlabId>, u64)> = BTreeMap::new();
        loop {
            let mut needy: Vec<(Share, TenantId)> = self
                .borrowers
                .iter()
                .filter(|(&id, b)| self.held_by(id) + b.slab_bytes <= b.want)
                .map(|(&id, b)| (Share::of(self.held_by(id), b.weight), id))
                .collect();
            needy.sort();
            let granted = needy.iter().find_map(|&(_, borrower)| {
                let b = &self.borrowers[&borrower];
                self.lender_with_room(b, b.slab_bytes).map(|lender| (borrower, lender, b.slab_bytes))
            });
            let Some((borrower, lender, bytes)) = granted else { break };
            let id = self.next_slab;
            self.next_slab += 1;
            self.slabs.insert(id, Slab { lender, borrower: Some(borrower), bytes, stage: Stage::Making });
            let ask = asks.entry(lender).or_insert_with(|| (Vec::new(), bytes));
            ask.0.push(id);
        }
        for (lender, (ids, slab_bytes)) in asks {
            actions.push(Action::Make { lender, ids, slab_bytes });
        }
        actions.extend(self.take_from_richest(now));
        actions
    }

    /// The lender on another GPU than the borrower's, that it has not refused, with the most
    /// room for a slab of `bytes`.
    fn lender_with_room(&self, borrower: &Borrower, bytes: u64) -> Option<LenderId> {
        self.lenders
            .iter()
            .filter(|(id, l)| !l.gone && l.gpu != borrower.gpu && !borrower.refused.contains(id))
            .map(|(&id, l)| (l.offer.saturating_sub(self.lent_by(id)), id))
            .filter(|&(room, _)| room >= bytes)
            .max_by_key(|&(room, id)| (room, std::cmp::Reverse(id)))
            .map(|(_, id)| id)
    }

    /// Lenders lending more than they offer: slabs asked back, from the borrower holding
    /// most of that lender's first.
    fn shrink_to_offers(&mut self, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        let lenders: Vec<LenderId> = self.lenders.keys().copied().collect();
        for lender in lenders {
            let offer = self.lenders[&lender].offer;
            while self.lent_by(lender) > offer {
                let mut by_borrower: BTreeMap<TenantId, u64> = BTreeMap::new();
                for s in self.slabs.values().filter(|s| s.lender == lender && s.stage == Stage::Lent) {
                    if let Some(b) = s.borrower {
                        *by_borrower.entry(b).or_default() += s.bytes;
                    }
                }
                let Some((&borrower, _)) = by_borrower.iter().max_by_key(|&(&b, &bytes)| (bytes, std::cmp::Reverse(b)))
                else {
                    break; // only slabs still being made: they come back as soon as they are sent
                };
                actions.extend(self.ask_back(borrower, Some(lender), now));
            }
        }
        actions
    }

    /// One slab back, for a borrower that wants more and cannot get it from a lender with room,
    /// from one holding more than it wants, else from the one holding most for its weight if
    /// it would still hold at least as much for its weight as the other once that one has a
    /// slab more (module docs).
    fn take_from_richest(&mut self, now: Instant) -> Vec<Action> {
        let starved: Vec<TenantId> = self
            .borrowers
            .iter()
            .filter(|(&id, b)| self.held_by(id) + b.slab_bytes <= b.want)
            .map(|(&id, _)| id)
            .collect();
        for poor in starved {
            let (gpu, slab, weight) =
                (self.borrowers[&poor].gpu, self.borrowers[&poor].slab_bytes, self.borrowers[&poor].weight);
            let poor_after = Share::of(self.held_by(poor) + slab, weight);
            let refused = self.borrowers[&poor].refused.clone();
            let richest = self
                .borrowers
                .iter()
                .filter(|&(&id, _)| id != poor)
                .filter(|&(&id, b)| {
                    let spare = self.held_by(id).saturating_sub(b.slab_bytes);
                    spare >= b.want || Share::of(spare, b.weight) >= poor_after
                })
                .map(|(&id, b)| (self.held_by(id) > b.want, Share::of(self.held_by(id), b.weight), id))
                .max()
                .map(|(_, share, id)| (share, id));
            if let Some((_, rich)) = richest {
                // Only slabs of lenders the poor one can use help it.
                let usable = |l: LenderId| !refused.contains(&l) && self.lenders.get(&l).is_some_and(|l| l.gpu != gpu);
                let lender = self
                    .slabs
                    .values()
                    .find(|s| s.borrower == Some(rich) && s.stage == Stage::Lent && usable(s.lender))
                    .map(|s| s.lender);
                if let Some(lender) = lender {
                    return self.ask_back(rich, Some(lender), now);
                }
            }
        }
        Vec::new()
    }

    /// Asks `borrower` for one slab back (of `lender`'s, if given).
    fn ask_back(&mut self, borrower: TenantId, lender: Option<LenderId>, now: Instant) -> Vec<Action> {
        let deadline_ms = self.config.return_deadline_ms;
        let id = self
            .slabs
            .iter()
            .rev()
            .find(|(_, s)| {
                s.borrower == Some(borrower) && s.stage == Stage::Lent && lender.is_none_or(|l| s.lender == l)
            })
            .map(|(&id, _)| id);
        let Some(id) = id else { return Vec::new() };
        let deadline = now + Duration::from_millis(deadline_ms);
        self.slabs.get_mut(&id).expect("found").stage = Stage::Returning { deadline, escalated: false };
        vec![Action::Return { borrower, ids: vec![id], deadline_ms }]
    }
}

/// Bytes held for a weight, compared exactly (`held₁ × weight₂` against `held₂ × weight₁`).
#[derive(Debug, Clone, Copy)]
struct Share {
    held: u64,
    weight: u64,
}

impl Share {
    fn of(held: u64, weight: u64) -> Self {
        Self { held, weight: weight.max(1) }
    }
}

impl Ord for Share {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (u128::from(self.held) * u128::from(other.weight)).cmp(&(u128::from(other.held) * u128::from(self.weight)))
    }
}

impl PartialOrd for Share {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Share {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for Share {}

impl Slab {
    fn returning(&self) -> bool {
        matches!(self.stage, Stage::Returning { .. })
    }
}

#[cfg(test)]
#[path = "lending_tests.rs"]
mod tests;
