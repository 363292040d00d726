//! The limits policy (limits.rs), property-tested: the budget never exceeds the grant, never
//! rises unless the GPU is idle past the margin, shrinks below what is held under hard
//! pressure, is monotone in free memory, and does not oscillate — for one reading repeated,
//! and in closed loop with a GPU whose free memory follows what the store holds.

use proptest::prelude::*;
use tiermem_swap::limits::{hbm_budget, Decision, Limits, Pressure, Reading};

const CHUNK: u64 = 2 << 20;
const GIB: u64 = 1 << 30;

fn limits() -> impl Strategy<Value = Limits> {
    (0..16 * GIB, 0..16 * GIB, 0..4 * GIB, 1..256 * CHUNK).prop_map(|(a, b, grow_margin, min_budget)| Limits {
        soft_free: a.max(b),
        hard_free: a.min(b),
        grow_margin,
        min_budget,
    })
}

/// A GPU of up to 144 GiB, at least as large as the least budget, and what the store holds.
fn reading(limits: Limits) -> impl Strategy<Value = Reading> {
    let least = limits.min_chunks(CHUNK) * CHUNK;
    (least..144 * GIB)
        .prop_flat_map(|total| (Just(total), 0..=total))
        .prop_flat_map(|(total, free)| (0..=total - free).prop_map(move |held| Reading { total, free, held }))
}

fn case() -> impl Strategy<Value = (Limits, Option<u64>, Reading, u64)> {
    limits().prop_flat_map(|limits| {
        (Just(limits), prop::option::of(0..160 * GIB), reading(limits), 0..160 * GIB)
            .prop_map(|(limits, cap, reading, current)| (limits, cap, reading, current.min(reading.total)))
    })
}

fn floor(limits: &Limits) -> u64 {
    limits.min_chunks(CHUNK) * CHUNK
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn the_budget_is_whole_chunks_within_the_grant_the_gpu_and_the_floor((limits, cap, reading, current) in case()) {
        let Decision { budget, .. } = hbm_budget(&limits, cap, CHUNK, reading, current);
        prop_assert_eq!(budget % CHUNK, 0);
        prop_assert!(budget >= floor(&limits));
        prop_assert!(budget <= cap.unwrap_or(u64::MAX).max(floor(&limits)), "{budget} above the grant {cap:?}");
        prop_assert!(budget <= reading.total);
    }

    #[test]
    fn the_budget_rises_only_when_the_gpu_is_idle_past_the_margin((limits, cap, reading, current) in case()) {
        let Decision { budget, pressure } = hbm_budget(&limits, cap, CHUNK, reading, current);
        let idle = reading.free >= limits.soft_free.saturating_add(limits.grow_margin);
        prop_assert_eq!(pressure == Pressure::Idle, idle);
        if !idle {
            prop_assert!(budget <= current.max(floor(&limits)), "{pressure:?}: {current} rose to {budget}");
        }
        if reading.free < limits.soft_free {
            prop_assert!(budget <= reading.held.max(floor(&limits)), "took more under the soft limit");
        }
    }

    #[test]
    fn under_the_hard_limit_the_budget_gives_back_the_shortfall(
        (limits, cap, reading, current) in case(),
        below in 0.0..1.0f64,
    ) {
        prop_assume!(limits.hard_free > 0);
        let reading = Reading { free: (reading.free as f64 * below) as u64 % limits.hard_free, ..reading };
        let Decision { budget, pressure } = hbm_budget(&limits, cap, CHUNK, reading, current);
        prop_assert_eq!(pressure, Pressure::Hard);
        let shortfall = limits.soft_free - reading.free;
        prop_assert!(budget <= reading.held.saturating_sub(shortfall).max(floor(&limits)));
        if reading.held >= floor(&limits) + shortfall + CHUNK {
            prop_assert!(budget < reading.held, "held {} kept under hard pressure", reading.held);
        }
    }

    #[test]
    fn more_free_memory_never_means_a_smaller_budget((limits, cap, reading, current) in case(), more in 0..8 * GIB) {
        let richer = Reading { free: (reading.free + more).min(reading.total - reading.held), ..reading };
        let poor = hbm_budget(&limits, cap, CHUNK, reading, current).budget;
        let rich = hbm_budget(&limits, cap, CHUNK, richer, current).budget;
        prop_assert!(poor <= rich, "free {} -> {poor}, free {} -> {rich}", reading.free, richer.free);
    }

    #[test]
    fn the_same_reading_gives_the_same_budget_again((limits, cap, reading, current) in case()) {
        let first = hbm_budget(&limits, cap, CHUNK, reading, current);
        let again = hbm_budget(&limits, cap, CHUNK, reading, first.budget);
        prop_assert_eq!(first, again);
    }

    /// Others use `others` bytes; the store wants to hold `demand` and holds as much of it as
    /// the budget allows; free memory follows. The budget settles within three steps and then
    /// stays, and where it can, leaves at least the hard level free.
    #[test]
    fn in_closed_loop_the_budget_settles(
        (limits, cap, reading, current) in case(),
        others_share in 0.0..1.0f64,
        demand_share in 0.0..1.5f64,
    ) {
        let total = reading.total;
        let mut held = reading.held;
        let others = ((total - held) as f64 * others_share) as u64;
        let demand = (total as f64 * demand_share) as u64;
        let mut budget = current;
        let mut seen = Vec::new();
        for _ in 0..8 {
            let free = total.saturating_sub(others + held);
            budget = hbm_budget(&limits, cap, CHUNK, Reading { total, free, held }, budget).budget;
            held = held.min(budget).max(demand.min(budget));
            seen.push(budget);
        }
        prop_assert!(seen[3..].windows(2).all(|w| w[0] == w[1]), "the budget moved: {seen:?}");
        let free = total.saturating_sub(others + held);
        if held > floor(&limits) && others + limits.hard_free <= total {
            prop_assert!(free >= limits.hard_free.min(total - others - floor(&limits)),
                "settled with {free} free under a hard limit of {}: {seen:?}", limits.hard_free);
        }
    }
}

#[test]
fn a_gpu_that_fills_up_and_empties_again_sees_take_hold_give_back_and_grow() {
    let limits = Limits { soft_free: 4 * GIB, hard_free: 2 * GIB, grow_margin: GIB, min_budget: 32 << 20 };
    let total = 80 * GIB;
    let step = |free, held, current| hbm_budget(&limits, None, CHUNK, Reading { total, free, held }, current);
    let idle = step(70 * GIB, 6 * GIB, 32 << 20);
    assert_eq!(idle, Decision { budget: 72 * GIB, pressure: Pressure::Idle });
    // A job takes 66 GiB: 3 GiB free, below the soft level.
    let soft = step(3 * GIB, 11 * GIB, idle.budget);
    assert_eq!(soft, Decision { budget: 11 * GIB, pressure: Pressure::Soft });
    // It takes 2 GiB more: give back until 4 GiB are free.
    let hard = step(GIB, 11 * GIB, soft.budget);
    assert_eq!(hard, Decision { budget: 8 * GIB, pressure: Pressure::Hard });
    // Given back: 4 GiB free, steady.
    assert_eq!(step(4 * GIB, 8 * GIB, hard.budget), Decision { budget: 8 * GIB, pressure: Pressure::Steady });
    // Free wobbles by half a GiB: nothing moves.
    assert_eq!(step(4 * GIB + GIB / 2, 8 * GIB, hard.budget).budget, 8 * GIB);
    // The job ends.
    assert_eq!(step(72 * GIB, 8 * GIB, hard.budget), Decision { budget: 76 * GIB, pressure: Pressure::Idle });
}
