//! Working sets admitted whole (admission.rs): worked examples, then its properties together
//! with fair share's.

use proptest::prelude::*;
use tiermem_policy::admission::{admit, admit_beyond, fits_alone, kept, with_admitted};
use tiermem_policy::share::{fair_shares, Claim};

fn claim(weight: u32, demand: u64) -> Claim {
    Claim { weight, demand, floor: 0, quota: None, priority: 0 }
}

fn budgets(capacity: u64, claims: &[Claim], keep: &[u64], order: &[usize]) -> Vec<u64> {
    let admitted = admit(capacity, claims, keep, order);
    fair_shares(capacity, &with_admitted(claims, keep, &admitted)).iter().map(|s| s.budget).collect()
}

#[test]
fn three_working_sets_of_six_tenths_one_runs_whole_and_two_share_the_rest() {
    // The daemon's benchmark: three jobs of 0.6× the GPU. Fair share gives 33 each (all page);
    // here the first in turn runs whole and the other two split what is left.
    let claims = [claim(1, 60), claim(1, 60), claim(1, 60)];
    assert_eq!(admit(100, &claims, &[5, 5, 5], &[0, 1, 2]), vec![true, false, false]);
    assert_eq!(budgets(100, &claims, &[5, 5, 5], &[0, 1, 2]), vec![60, 20, 20]);
    // The order is the caller's: the third's turn first.
    assert_eq!(budgets(100, &claims, &[5, 5, 5], &[2, 0, 1]), vec![20, 20, 60]);
}

#[test]
fn a_working_set_fits_alone_when_the_others_at_their_keeps_leave_room_for_it() {
    let claims = [claim(1, 60), claim(1, 80), claim(1, 10)];
    // 60 + 10 + 10 and 80 + 10 + 10 fit 100; but not 80 beside 60 (the first's whole demand).
    assert!(fits_alone(100, &claims, &[10, 10, 10], 0) && fits_alone(100, &claims, &[10, 10, 10], 1));
    assert!(!fits_alone(90, &claims, &[10, 10, 10], 1));
    // What a tenant keeps is at most its demand: the third keeps 10 of its 10.
    assert!(fits_alone(100, &claims, &[10, 10, 30], 1));
    assert!(!fits_alone(100, &claims, &[10, 10, 10], 3), "no such tenant");
}

#[test]
fn when_every_working_set_fits_it_is_fair_share() {
    let claims = [claim(1, 30), claim(2, 50), claim(1, 10)];
    assert_eq!(admit(100, &claims, &[4, 4, 4], &[0, 1, 2]), vec![true, true, true]);
    let plain: Vec<u64> = fair_shares(100, &claims).iter().map(|s| s.budget).collect();
    assert_eq!(budgets(100, &claims, &[4, 4, 4], &[0, 1, 2]), plain);
}

#[test]
fn a_hog_asking_for_more_than_the_gpu_is_never_admitted_and_the_others_run_whole() {
    let claims = [claim(1, 300), claim(1, 30), claim(1, 30)];
    assert_eq!(admit(100, &claims, &[10, 10, 10], &[0, 1, 2]), vec![false, true, true]);
    assert_eq!(budgets(100, &claims, &[10, 10, 10], &[0, 1, 2]), vec![40, 30, 30]);
}

#[test]
fn a_tenant_not_admitted_keeps_its_floor_and_its_keep_whatever_the_weights() {
    let pinned = Claim { floor: 25, ..claim(1, 60) };
    let heavy = claim(50, 60);
    let claims = [claim(1, 60), pinned, heavy, claim(1, 60)];
    let keep = [5, 5, 5, 5];
    let admitted = admit(100, &claims, &keep, &[0, 1, 2, 3]);
    assert_eq!(admitted, vec![true, false, false, false], "60 + 25 + 5 + 5 fits; a second 60 would not");
    let b = budgets(100, &claims, &keep, &[0, 1, 2, 3]);
    assert_eq!(b[0], 60);
    assert!(b[1] >= 25 && b[3] >= 5, "{b:?}");
    assert_eq!(b.iter().sum::<u64>(), 100);
}

#[test]
fn quotas_bound_the_whole_working_set_and_unlisted_tenants_wait() {
    let capped = Claim { quota: Some(40), ..claim(1, 90) };
    let claims = [capped, claim(1, 50), claim(1, 50)];
    assert_eq!(admit(100, &claims, &[5, 5, 5], &[0, 1, 2]), vec![true, true, false]);
    assert_eq!(admit(100, &claims, &[5, 5, 5], &[2]), vec![false, false, true]);
    assert_eq!(kept(&claims, &[5, 200, 0]), vec![5, 50, 0], "keep within the demand");
}

#[test]
fn when_none_fits_the_first_runs_beyond_if_the_others_can_wait_and_never_otherwise() {
    // Two programs of 150 and 120 on a GPU of 100, each keeping 2 while it waits.
    let claims = [claim(1, 150), claim(1, 120)];
    let none = admit(100, &claims, &[2, 2], &[0, 1]);
    assert_eq!(none, vec![false, false]);
    assert_eq!(admit_beyond(100, &claims, &[2, 2], &[0, 1], &[true, true], &none), Some((0, 98)));
    assert_eq!(admit_beyond(100, &claims, &[2, 2], &[1, 0], &[true, true], &none), Some((1, 98)));
    // The second cannot wait (an engine): it would crawl on its keep, so fair share it is.
    assert_eq!(admit_beyond(100, &claims, &[2, 2], &[0, 1], &[true, false], &none), None);
    // Alone, or when a working set fits, the rule does not apply.
    assert_eq!(admit_beyond(100, &claims[..1], &[2], &[0], &[true], &[false]), None);
    let one = admit(100, &[claim(1, 60), claim(1, 150)], &[2, 2], &[0, 1]);
    assert_eq!(admit_beyond(100, &[claim(1, 60), claim(1, 150)], &[2, 2], &[0, 1], &[true, true], &one), None);
}

fn arb_claims() -> impl Strategy<Value = (u64, Vec<(Claim, u64)>, Vec<usize>)> {
    let one = (1u32..5, 0u64..400, 0u64..60, prop::option::of(0u64..300), -2i32..3, 0u64..40);
    (1u64..500, prop::collection::vec(one, 1..7)).prop_flat_map(|(capacity, raw)| {
        let n = raw.len();
        let claims: Vec<(Claim, u64)> = raw
            .into_iter()
            .map(|(weight, demand, floor, quota, priority, keep)| {
                (Claim { weight, demand, floor, quota, priority }, keep)
            })
            .collect();
        (Just(capacity), Just(claims), Just((0..n).collect::<Vec<_>>()).prop_shuffle())
    })
}

proptest! {
    #[test]
    fn admission_fits_is_maximal_and_shares_honour_it((capacity, pairs, order) in arb_claims()) {
        let claims: Vec<Claim> = pairs.iter().map(|p| p.0).collect();
        let keep: Vec<u64> = pairs.iter().map(|p| p.1).collect();
        let admitted = admit(capacity, &claims, &keep, &order);
        let held = kept(&claims, &keep);
        let whole = |c: &Claim| with_admitted(std::slice::from_ref(c), &[0], &[true])[0].floor;
        let asked: u64 = claims.iter().zip(&held).zip(&admitted)
            .map(|((c, &k), &a)| if a { whole(c) } else { k }).sum();
        let keeps: u64 = held.iter().sum();
        if keeps <= capacity {
            prop_assert!(asked <= capacity, "admitted {admitted:?} ask {asked} of {capacity}");
            // Admitted beyond its fit, a tenant gets no more than the others' keeps leave.
            let can_wait = vec![true; claims.len()];
            if let Some((i, demand)) = admit_beyond(capacity, &claims, &keep, &order, &can_wait, &admitted) {
                let others: u64 = (0..claims.len()).filter(|&j| j != i).map(|j| held[j]).sum();
                prop_assert!(demand + others <= capacity && demand > held[i], "{i}: {demand} beside {others} of {capacity}");
                prop_assert!(demand <= whole(&claims[i]));
            }
        } else {
            prop_assert!(admitted.iter().all(|a| !a), "nothing is admitted when the keeps do not fit");
        }
        // Maximal: no tenant left out could have been admitted as well.
        for i in 0..claims.len() {
            if !admitted[i] && keeps <= capacity {
                prop_assert!(asked - held[i] + whole(&claims[i]) > capacity, "tenant {i} would fit");
            }
        }
        let shares = fair_shares(capacity, &with_admitted(&claims, &keep, &admitted));
        let total: u64 = shares.iter().map(|s| s.budget).sum();
        prop_assert!(total <= capacity.max(claims.iter().map(|c| c.floor).sum()));
        if keeps <= capacity {
            for i in 0..claims.len() {
                let budget = shares[i].budget;
                match admitted[i] {
                    true => prop_assert_eq!(budget, whole(&claims[i]), "an admitted tenant gets its whole demand"),
                    false => prop_assert!(budget >= held[i], "tenant {} keeps {} (got {})", i, held[i], budget),
                }
                prop_assert!(budget >= claims[i].floor, "acquired memory is never taken away");
            }
        }
        // When every working set fits, it is fair share.
        if claims.iter().map(whole).sum::<u64>() <= capacity {
            prop_assert!(admitted.iter().all(|&a| a));
            let plain: Vec<u64> = fair_shares(capacity, &claims).iter().map(|s| s.budget).collect();
            prop_assert_eq!(shares.iter().map(|s| s.budget).collect::<Vec<_>>(), plain);
        }
    }
}
