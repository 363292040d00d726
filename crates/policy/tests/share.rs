//! Fair share (share.rs): worked examples, then the properties water-filling must have.

use proptest::prelude::*;
use tiermem_policy::share::{fair_shares, give_back_order, spread_spare, stage_grants, Claim};

fn claim(weight: u32, demand: u64) -> Claim {
    Claim { weight, demand, floor: 0, quota: None, priority: 0 }
}

fn budgets(capacity: u64, claims: &[Claim]) -> Vec<u64> {
    fair_shares(capacity, claims).iter().map(|s| s.budget).collect()
}

#[test]
fn busy_tenants_split_by_weight() {
    assert_eq!(budgets(300, &[claim(1, 1000), claim(2, 1000)]), vec![100, 200]);
    assert_eq!(budgets(90, &[claim(1, 90), claim(1, 90), claim(1, 90)]), vec![30, 30, 30]);
}

#[test]
fn an_idle_tenants_part_is_lent_and_returned_when_it_wants_it() {
    let shares = fair_shares(100, &[claim(1, 10), claim(1, 500)]);
    assert_eq!((shares[0].budget, shares[1].budget), (10, 90));
    assert_eq!((shares[0].lent(), shares[1].borrowed()), (40, 40));
    // Its demand grows: the loan comes back.
    let shares = fair_shares(100, &[claim(1, 80), claim(1, 500)]);
    assert_eq!((shares[0].budget, shares[1].budget), (50, 50));
    assert_eq!(shares[1].borrowed(), 0);
}

#[test]
fn quotas_cap_and_floors_hold() {
    let quota = Claim { quota: Some(20), ..claim(4, 1000) };
    assert_eq!(budgets(100, &[quota, claim(1, 1000)]), vec![20, 80]);
    // A floor above the fair part stays; the rest goes to the other tenant.
    let pinned = Claim { floor: 70, ..claim(1, 100) };
    assert_eq!(budgets(100, &[pinned, claim(1, 100)]), vec![70, 30]);
}

#[test]
fn floors_that_do_not_fit_are_water_filled() {
    let a = Claim { floor: 80, ..claim(1, 80) };
    let b = Claim { floor: 80, ..claim(1, 80) };
    assert_eq!(budgets(100, &[a, b]), vec![50, 50]);
}

#[test]
fn rounding_leftovers_go_to_the_largest_remainder_then_priority() {
    let high = Claim { priority: 5, ..claim(1, 100) };
    assert_eq!(budgets(10, &[claim(1, 100), claim(1, 100), high]), vec![3, 3, 4]);
}

#[test]
fn the_tenant_most_over_its_share_gives_back_first() {
    let claims = [claim(1, 0), Claim { priority: -1, ..claim(1, 0) }, claim(1, 0), claim(1, 0)];
    let order = give_back_order(&[50, 30, 30, 10], &[20, 20, 20, 20], &claims);
    assert_eq!(order, vec![0, 1, 2], "30 over first; of the two 10 over, the lower priority");
}

#[test]
fn grants_wait_for_the_shrinking_and_go_to_the_tenant_holding_least() {
    // B held everything; A and C arrive. B is cut at once; nobody grows before B has shrunk.
    assert_eq!(stage_grants(100, &[40, 30, 30], &[0, 100, 0]), vec![0, 30, 0]);
    // B met its budget: 70 free, A (holding least, first in index) gets 40, C 30.
    assert_eq!(stage_grants(100, &[40, 30, 30], &[0, 30, 0]), vec![40, 30, 30]);
    // Only 25 free: the tenant holding least is served first.
    assert_eq!(stage_grants(100, &[60, 60], &[40, 35]), vec![40, 60]);
    assert_eq!(stage_grants(100, &[50, 60], &[45, 30]), vec![45, 55]);
}

fn claims() -> impl Strategy<Value = Vec<Claim>> {
    let one = (1u32..8, 0u64..400, 0u64..120, prop::option::of(0u64..300), -2i32..3)
        .prop_map(|(weight, demand, floor, quota, priority)| Claim { weight, demand, floor, quota, priority });
    prop::collection::vec(one, 1..8)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn shares_fit_respect_bounds_and_fill_the_tier(capacity in 0u64..1000, claims in claims()) {
        let shares = budgets(capacity, &claims);
        let total: u64 = shares.iter().sum();
        prop_assert!(total <= capacity);
        let floors: u64 = claims.iter().map(|c| c.floor).sum();
        let high = |c: &Claim| c.floor.max(c.demand.min(c.quota.unwrap_or(u64::MAX)));
        for (c, &s) in claims.iter().zip(&shares) {
            prop_assert!(s <= high(c), "{s} above demand/quota of {c:?}");
            if floors <= capacity {
                prop_assert!(s >= c.floor, "{s} below the floor of {c:?}");
            }
        }
        let highs: u64 = claims.iter().map(high).sum();
        let wanted = if floors <= capacity { highs } else { floors };
        prop_assert_eq!(total, capacity.min(wanted), "the tier is filled as far as anyone wants it");
    }

    #[test]
    fn no_tenant_could_gain_from_one_with_a_higher_level(capacity in 0u64..1000, claims in claims()) {
        // Max-min: a tenant below its high is never behind (per weight, up to rounding) one
        // that is above its low.
        let shares = budgets(capacity, &claims);
        let floors: u64 = claims.iter().map(|c| c.floor).sum();
        if floors > capacity {
            return Ok(()); // floors_that_do_not_fit_are_water_filled covers these
        }
        let high = |c: &Claim| c.floor.max(c.demand.min(c.quota.unwrap_or(u64::MAX)));
        for (i, ci) in claims.iter().enumerate() {
            for (j, cj) in claims.iter().enumerate() {
                if shares[i] < high(ci) && shares[j] > cj.floor {
                    let (wi, wj) = (u64::from(ci.weight), u64::from(cj.weight));
                    prop_assert!((shares[j] - 1) * wi <= (shares[i] + 1) * wj,
                        "tenant {j} ({}) is ahead of starved tenant {i} ({})", shares[j], shares[i]);
                }
            }
        }
    }

    #[test]
    fn equal_claims_get_equal_shares(capacity in 0u64..1000, n in 1usize..8, demand in 0u64..400, weight in 1u32..5) {
        let shares = budgets(capacity, &vec![claim(weight, demand); n]);
        let (min, max) = (shares.iter().min().unwrap(), shares.iter().max().unwrap());
        prop_assert!(max - min <= 1, "{shares:?}");
        prop_assert_eq!(shares, budgets(capacity, &vec![claim(weight, demand); n]), "deterministic");
    }

    #[test]
    fn more_weight_never_means_less(capacity in 0u64..1000, claims in claims(), who in 0usize..8, extra in 1u32..5) {
        let who = who % claims.len();
        let before = budgets(capacity, &claims)[who];
        let mut heavier = claims.clone();
        heavier[who].weight += extra;
        prop_assert!(budgets(capacity, &heavier)[who] + 1 >= before);
    }

    #[test]
    fn staged_grants_never_promise_the_tier_twice_and_converge(
        capacity in 0u64..1000,
        claims in claims(),
        start in prop::collection::vec(0u64..400, 8),
    ) {
        let targets = budgets(capacity, &claims);
        let mut holding: Vec<u64> = start[..targets.len()].to_vec();
        for _round in 0..3 {
            let granted = stage_grants(capacity, &targets, &holding);
            let promised: u64 = granted.iter().zip(&holding).map(|(g, h)| *g.max(h)).sum();
            prop_assert!(promised <= capacity.max(holding.iter().sum()));
            for (g, t) in granted.iter().zip(&targets) {
                prop_assert!(g <= t);
            }
            holding = granted; // every shrink met
        }
        prop_assert_eq!(holding, targets);
    }
}

#[test]
fn spare_is_split_by_weight_within_quotas() {
    let claims = [claim(1, 10), claim(2, 10), Claim { quota: Some(15), ..claim(1, 10) }];
    let shares = fair_shares(100, &claims);
    let spare = spread_spare(100, &claims, &shares);
    // 70 spare: the capped tenant may take 5; the others' totals (share + spare) come out
    // 1:2, 28 and 57 (the spare is water-filled on top of the shares).
    assert_eq!(spare, vec![18, 47, 5]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn spare_fills_what_quotas_allow_and_never_more(capacity in 0u64..1000, claims in claims()) {
        let shares = fair_shares(capacity, &claims);
        let spare = spread_spare(capacity, &claims, &shares);
        let total: u64 = shares.iter().zip(&spare).map(|(s, x)| s.budget + x).sum();
        prop_assert!(total <= capacity);
        let room: u64 = claims.iter().zip(&shares).map(|(c, s)| s.budget.max(c.quota.unwrap_or(capacity).min(capacity))).sum();
        prop_assert_eq!(total, capacity.min(room.max(shares.iter().map(|s| s.budget).sum())));
        for ((c, s), x) in claims.iter().zip(&shares).zip(&spare) {
            if *x > 0 {
                prop_assert!(s.budget + x <= c.quota.unwrap_or(u64::MAX), "spare beyond the quota of {c:?}");
            }
        }
    }
}
