//! Fair share of one tier among tenants: how much of a GPU's HBM (or of the node's pinned host
//! memory, or of its file tier) each process may hold, when several share it.
//!
//! # The share: weighted max-min fairness with floors (water-filling)
//! Each tenant states a [`Claim`]: a weight, a *demand* (the units it would use if it could),
//! a *floor* (units it holds acquired, which cannot be taken away) and an optional hard
//! *quota*. Its share lies between `low = floor` and `high = max(floor, min(demand, quota))`.
//! Water-filling raises one level `L` until the tier is full; every tenant gets
//! `clamp(weight × L, low, high)`. So:
//!
//! * a tenant that wants less than its weighted part gets what it wants, and the rest of its
//!   part is **lent** to the busier ones; when its demand grows, the next computation hands it
//!   back (nothing here remembers a loan: shares are a pure function of the claims);
//! * no tenant gets more than it asks for (demand) or may have (quota), unless its floor says
//!   it already holds more (acquired memory is never taken away);
//! * when the floors alone exceed the capacity (they cannot all be met), the capacity is
//!   water-filled over the floors instead, so no tenant is starved for another's pins.
//!
//! What no tenant demands is *spare*: [`spread_spare`] water-fills it on top of the shares
//! (by weight, within quotas) as headroom, so a tenant can grow at once without waiting for the daemon,
//! and the next computation takes the headroom back first when someone's demand grows.
//!
//! Shares are whole units (the daemon counts 2 MiB chunks). The units left over after rounding
//! down (fewer than the tenants on the slope) go one each to the largest remainders, then
//! higher priority, then lower index: equal claims get equal shares up to that one unit, and
//! the result is a deterministic function of its input.
//!
//! # Taking back and handing out (GPrioSwap §4)
//! A share is a target; memory moves towards it in two steps. [`give_back_order`] lists the
//! tenants that hold more than their share, the one most over it first (lower priority first
//! among equals): those are asked to shrink. [`stage_grants`] lets the others grow only into
//! memory nobody may still be holding, the tenant holding least first, so the tier is never
//! promised twice while shrinking tenants evict.
//!
//! Everything here is pure: no clock, no I/O, no randomness.

use std::cmp::Ordering;

/// What one tenant asks of a tier, in whole units (the daemon uses chunks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// Relative weight (≥ 1; 0 is taken as 1).
    pub weight: u32,
    /// Units the tenant would use if it could (its working set, allocations included).
    pub demand: u64,
    /// Units it holds that cannot be taken away (acquired chunks).
    pub floor: u64,
    /// A hard limit from the configuration, if any.
    pub quota: Option<u64>,
    /// Larger is more important: breaks ties in rounding and in who gives back first.
    pub priority: i32,
}

impl Claim {
    fn weight(&self) -> u64 {
        u64::from(self.weight.max(1))
    }

    /// The most this claim may get: its demand within its quota, never below its floor.
    pub(crate) fn high(&self) -> u64 {
        self.floor.max(self.demand.min(self.quota.unwrap_or(u64::MAX)))
    }
}

/// One tenant's part of a tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// The units it may hold now.
    pub budget: u64,
    /// What it would get if every tenant wanted all it may have (demand = quota): its own part.
    pub entitled: u64,
}

impl Share {
    /// Units lent to this tenant from others' idle parts.
    pub fn borrowed(&self) -> u64 {
        self.budget.saturating_sub(self.entitled)
    }

    /// Units of its own part this tenant does not use, lent to others.
    pub fn lent(&self) -> u64 {
        self.entitled.saturating_sub(self.budget)
    }
}

/// The fair shares of `capacity` units among `claims` (same order).
pub fn fair_shares(capacity: u64, claims: &[Claim]) -> Vec<Share> {
    let budgets = water_fill(capacity, claims, claims.iter().map(|c| (c.floor, c.high())).collect());
    let own_part = |c: &Claim| c.floor.max(c.quota.unwrap_or(capacity).min(capacity));
    let entitled = water_fill(capacity, claims, claims.iter().map(|c| (c.floor, own_part(c))).collect());
    budgets.into_iter().zip(entitled).map(|(budget, entitled)| Share { budget, entitled }).collect()
}

/// The units of `capacity` that `shares` (from [`fair_shares`]) leave over, water-filled on
/// top of the shares by weight within the quotas: each tenant's headroom above its share.
pub fn spread_spare(capacity: u64, claims: &[Claim], shares: &[Share]) -> Vec<u64> {
    let bounds =
        claims.iter().zip(shares).map(|(c, s)| (s.budget, s.budget.max(c.quota.unwrap_or(capacity).min(capacity))));
    let with_spare = water_fill(capacity, claims, bounds.collect());
    with_spare.iter().zip(shares).map(|(total, share)| total.saturating_sub(share.budget)).collect()
}

/// Water-fills `capacity` over `claims` between the `(low, high)` of each (`low ≤ high`);
/// when the lows alone do not fit, fills up to the lows instead.
fn water_fill(capacity: u64, claims: &[Claim], bounds: Vec<(u64, u64)>) -> Vec<u64> {
    let lows: u128 = bounds.iter().map(|b| u128::from(b.0)).sum();
    if lows > u128::from(capacity) {
        let floors_only: Vec<(u64, u64)> = bounds.iter().map(|&(lo, _)| (0, lo)).collect();
        return fill_between(capacity, claims, &floors_only);
    }
    fill_between(capacity, claims, &bounds)
}

/// A level `num / den` of the water (units per unit of weight).
#[derive(Debug, Clone, Copy)]
struct Level {
    num: u128,
    den: u128,
}

impl Level {
    fn cmp(self, other: Level) -> Ordering {
        (self.num * other.den).cmp(&(other.num * self.den))
    }
}

/// The water-fill proper, for bounds whose lows fit in `capacity`.
fn fill_between(capacity: u64, claims: &[Claim], bounds: &[(u64, u64)]) -> Vec<u64> {
    let highs: u128 = bounds.iter().map(|b| u128::from(b.1)).sum();
    if highs <= u128::from(capacity) {
        return bounds.iter().map(|b| b.1).collect();
    }
    // f(L) = Σ clamp(w·L, low, high) rises with L; its slope changes only at the breakpoints
    // low/w and high/w. Find the last breakpoint where it does not exceed the capacity.
    let weight = |i: usize| u128::from(claims[i].weight());
    let filled_at = |level: Level| -> u128 {
        // Σ clamp(w·num, low·den, high·den) ≤ capacity·den  ⇔  f(L) ≤ capacity
        (0..bounds.len())
            .map(|i| {
                let (lo, hi) = (u128::from(bounds[i].0) * level.den, u128::from(bounds[i].1) * level.den);
                (weight(i) * level.num).clamp(lo, hi)
            })
            .sum()
    };
    let mut breakpoints: Vec<Level> = vec![Level { num: 0, den: 1 }];
    for (i, &(lo, hi)) in bounds.iter().enumerate() {
        breakpoints.push(Level { num: u128::from(lo), den: weight(i) });
        breakpoints.push(Level { num: u128::from(hi), den: weight(i) });
    }
    breakpoints.sort_by(|a, b| a.cmp(*b));
    let fits = |level: Level| filled_at(level) <= u128::from(capacity) * level.den;
    let last_fit = breakpoints.iter().rposition(|&l| fits(l)).unwrap_or(0);
    let below = breakpoints[last_fit];
    // Between `below` and the next breakpoint each claim is fixed at its high (high/w ≤ below),
    // fixed at its low (low/w > below), or on the slope (w·L).
    let mut shares = vec![0u64; bounds.len()];
    let mut fixed: u128 = 0;
    let mut slope: Vec<usize> = Vec::new();
    for (i, &(lo, hi)) in bounds.iter().enumerate() {
        let (low_level, high_level) =
            (Level { num: u128::from(lo), den: weight(i) }, Level { num: u128::from(hi), den: weight(i) });
        if high_level.cmp(below) != Ordering::Greater {
            shares[i] = hi;
            fixed += u128::from(hi);
        } else if low_level.cmp(below) == Ordering::Greater {
            shares[i] = lo;
            fixed += u128::from(lo);
        } else {
            slope.push(i);
        }
    }
    let water = u128::from(capacity).saturating_sub(fixed);
    let total_weight: u128 = slope.iter().map(|&i| weight(i)).sum();
    if total_weight == 0 {
        return shares;
    }
    let mut handed = 0u128;
    for &i in &slope {
        let exact = weight(i) * water;
        shares[i] = (exact / total_weight) as u64;
        handed += exact / total_weight;
    }
    // What rounding down left: one unit each to the largest remainders (never past a high, as a
    // share with a remainder is below its exact value, itself at most its high).
    let mut leftover = water - handed;
    slope.sort_by(|&a, &b| {
        let rem = |i: usize| (weight(i) * water) % total_weight;
        rem(b).cmp(&rem(a)).then(claims[b].priority.cmp(&claims[a].priority)).then(a.cmp(&b))
    });
    for &i in &slope {
        if leftover == 0 {
            break;
        }
        shares[i] += 1;
        leftover -= 1;
    }
    shares
}

/// The tenants holding more than their share, in the order they should give back: the one
/// most over its share first, then lower priority, then lower index.
pub fn give_back_order(held: &[u64], shares: &[u64], claims: &[Claim]) -> Vec<usize> {
    let mut over: Vec<usize> = (0..held.len()).filter(|&i| held[i] > shares[i]).collect();
    over.sort_by(|&a, &b| {
        let excess = |i: usize| held[i] - shares[i];
        excess(b).cmp(&excess(a)).then(claims[a].priority.cmp(&claims[b].priority)).then(a.cmp(&b))
    });
    over
}

/// The budgets to hand out now on the way to `targets`, given what each tenant may still hold
/// (`holding`: its budget in force, or the larger old one while it is still shrinking).
///
/// A tenant above its target is cut to it at once; one below grows only into units that no
/// tenant may still be holding, the tenant holding least first (then lower index). So
/// `Σ max(holding, budget)` never exceeds `max(capacity, Σ holding)`; once every shrink is met
/// (`holding` = the budgets handed out), repeating this reaches the targets when they fit.
pub fn stage_grants(capacity: u64, targets: &[u64], holding: &[u64]) -> Vec<u64> {
    let mut budgets: Vec<u64> = targets.iter().zip(holding).map(|(&t, &h)| t.min(h)).collect();
    let held: u128 = holding.iter().map(|&h| u128::from(h)).sum();
    let mut room = u128::from(capacity).saturating_sub(held);
    let mut growers: Vec<usize> = (0..targets.len()).filter(|&i| targets[i] > holding[i]).collect();
    growers.sort_by_key(|&i| (holding[i], i));
    for i in growers {
        let grow = u128::from(targets[i] - holding[i]).min(room);
        budgets[i] = holding[i] + grow as u64;
        room -= grow;
    }
    budgets
}
