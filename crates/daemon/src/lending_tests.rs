use super::*;

const SLAB: u64 = 64 << 20;

fn lending() -> Lending {
    Lending::new(LendingConfig { return_deadline_ms: 1000, escalate: Escalate::Kill, lender_uids: vec![] })
}

/// Carries out `actions` as obliging peers would: lenders make every slab, borrowers return
/// what is asked. Returns the actions that came of it, until nothing more happens.
fn settle(l: &mut Lending, mut actions: Vec<Action>, now: Instant) -> Vec<Action> {
    let mut seen = Vec::new();
    while !actions.is_empty() {
        let mut next = Vec::new();
        for action in actions {
            match &action {
                Action::Make { lender, ids, .. } => next.extend(l.made(*lender, ids, &[], now).unwrap()),
                Action::Return { borrower, ids, .. } => next.extend(l.returned(*borrower, ids, now)),
                _ => {}
            }
            seen.push(action);
        }
        actions = next;
    }
    seen
}

fn lent_to(l: &Lending, borrower: TenantId) -> u64 {
    l.status().iter().flat_map(|s| s.lent.iter()).filter(|(b, _)| *b == borrower).map(|(_, bytes)| bytes).sum()
}

#[test]
fn a_borrower_gets_what_it_wants_up_to_the_offer_and_never_from_its_own_gpu() {
    let (mut l, now) = (lending(), Instant::now());
    let (own, a) = l.add_lender(10, 0, 100 * SLAB, now);
    assert!(a.is_empty());
    let (other, _) = l.add_lender(11, 1, 4 * SLAB, now);
    let a = l.add_borrower(7, 70, 0, SLAB, 1, now);
    assert!(a.is_empty(), "wants nothing yet");
    let wanted = l.set_want(7, 10 * SLAB, now);
    let actions = settle(&mut l, wanted, now);
    assert!(actions.iter().all(|a| !matches!(a, Action::Make { lender, .. } if *lender == own)));
    assert_eq!(lent_to(&l, 7), 4 * SLAB, "all GPU 1 offers, nothing of its own GPU's");
    let lends: u64 = actions
        .iter()
        .map(|a| match a {
            Action::Lend { borrower: 7, gpu: 1, ids, .. } => ids.len() as u64,
            _ => 0,
        })
        .sum();
    assert_eq!(lends, 4);
    assert!(l.lenders.contains_key(&other));
}

/// Settles `actions`, then rebalances and settles again as each usage report would, until
/// nothing moves.
fn settle_rounds(l: &mut Lending, mut actions: Vec<Action>, now: Instant) {
    for _ in 0..20 {
        settle(l, actions, now);
        actions = l.rebalance(now);
    }
}

/// One lender of 8 slabs on GPU 1; borrower 1 (weight 1) takes all of them alone, then borrower
/// 2 (weight `weight`) comes wanting as much; returns once they have settled.
fn newcomer_of_weight(weight: u32, now: Instant) -> Lending {
    let mut l = lending();
    l.add_lender(10, 1, 8 * SLAB, now);
    l.add_borrower(1, 100, 0, SLAB, 1, now);
    let wanted = l.set_want(1, 20 * SLAB, now);
    settle(&mut l, wanted, now);
    assert_eq!(lent_to(&l, 1), 8 * SLAB, "alone, it takes everything");
    l.add_borrower(2, 200, 0, SLAB, weight, now);
    let actions = l.set_want(2, 20 * SLAB, now);
    settle_rounds(&mut l, actions, now);
    l
}

#[test]
fn two_borrowers_converge_to_equal_shares() {
    let l = newcomer_of_weight(1, Instant::now());
    assert_eq!((lent_to(&l, 1), lent_to(&l, 2)), (4 * SLAB, 4 * SLAB));
}

#[test]
fn a_lender_lowering_its_offer_gets_the_difference_back_from_the_richest_first() {
    let (mut l, now) = (lending(), Instant::now());
    let (lender, _) = l.add_lender(10, 1, 6 * SLAB, now);
    l.add_borrower(1, 100, 0, SLAB, 1, now);
    l.add_borrower(2, 200, 0, SLAB, 1, now);
    let wanted = l.set_want(1, 4 * SLAB, now);
    settle(&mut l, wanted, now);
    let wanted = l.set_want(2, 2 * SLAB, now);
    settle(&mut l, wanted, now);
    assert_eq!((lent_to(&l, 1), lent_to(&l, 2)), (4 * SLAB, 2 * SLAB));
    let asked = l.set_offer(lender, 3 * SLAB, now);
    let back: Vec<(TenantId, usize)> = asked
        .iter()
        .filter_map(|a| match a {
            Action::Return { borrower, ids, .. } => Some((*borrower, ids.len())),
            _ => None,
        })
        .collect();
    assert_eq!(back.iter().map(|(_, n)| n).sum::<usize>(), 3);
    // The richest gives first: 4 and 2 become 2 and 1, or 1 and 2 (a tie broken either way).
    assert!(back.iter().filter(|(b, _)| *b == 1).map(|(_, n)| n).sum::<usize>() >= 2, "{back:?}");
    // Returned: the lender is told to release each.
    let released = settle(&mut l, asked, now);
    let releases = released.iter().filter(|a| matches!(a, Action::Release { .. })).count();
    assert_eq!(releases, 3);
    assert_eq!(lent_to(&l, 1) + lent_to(&l, 2), 3 * SLAB);
}

#[test]
fn a_borrower_that_does_not_return_in_time_is_escalated_once() {
    let (mut l, now) = (lending(), Instant::now());
    let (lender, _) = l.add_lender(10, 1, 2 * SLAB, now);
    l.add_borrower(1, 4242, 0, SLAB, 1, now);
    let wanted = l.set_want(1, 2 * SLAB, now);
    settle(&mut l, wanted, now);
    let asked = l.set_offer(lender, 0, now);
    assert_eq!(asked.len(), 2);
    assert!(l.expire(now + Duration::from_millis(999)).is_empty());
    let late = l.expire(now + Duration::from_millis(1000));
    assert!(
        matches!(&late[..], [Action::Late { borrower: 1, pid: 4242, ids, kill: true }] if ids.len() == 2),
        "{late:?}"
    );
    assert!(l.expire(now + Duration::from_secs(5)).is_empty(), "escalated once");
    // Killed: its connection closes, and the lender releases both.
    let gone = l.remove_borrower(1, now);
    assert_eq!(gone.iter().filter(|a| matches!(a, Action::Release { lender: x, .. } if *x == lender)).count(), 2);
}

#[test]
fn a_borrower_gone_while_its_slabs_are_made_has_them_released() {
    let (mut l, now) = (lending(), Instant::now());
    let (lender, _) = l.add_lender(10, 1, 2 * SLAB, now);
    l.add_borrower(1, 100, 0, SLAB, 1, now);
    let asked = l.set_want(1, 2 * SLAB, now);
    let Action::Make { ids, .. } = &asked[0] else { panic!("{asked:?}") };
    assert!(l.remove_borrower(1, now).is_empty());
    let answered = l.made(lender, ids, &[], now).unwrap();
    assert_eq!(
        answered,
        vec![Action::Release { lender, ids: vec![ids[0]] }, Action::Release { lender, ids: vec![ids[1]] }]
    );
    assert!(l.made(lender, ids, &[], now).is_err(), "answered twice");
}

#[test]
fn a_lender_that_cannot_make_a_slab_offers_no_more_and_a_gone_lender_gets_nothing_back() {
    let (mut l, now) = (lending(), Instant::now());
    let (lender, _) = l.add_lender(10, 1, 4 * SLAB, now);
    l.add_borrower(1, 100, 0, SLAB, 1, now);
    let asked = l.set_want(1, 4 * SLAB, now);
    let Action::Make { ids, .. } = &asked[0] else { panic!("{asked:?}") };
    let after = l.made(lender, &ids[..1], &ids[1..], now).unwrap();
    assert!(!after.iter().any(|a| matches!(a, Action::Make { .. })), "asks no more of it: {after:?}");
    assert_eq!(l.status()[0].offer, SLAB);
    // The lender exits: its slab is asked back, and its return releases nothing (the exit did).
    let back = l.remove_lender(lender, now);
    let [Action::Return { borrower: 1, ids: back_ids, .. }] = &back[..] else { panic!("{back:?}") };
    assert!(l.returned(1, back_ids, now).is_empty());
    assert!(l.status().is_empty(), "forgotten once its last slab is back");
}

#[test]
fn only_trusted_users_lend() {
    let l = Lending::new(LendingConfig { lender_uids: vec![1000], ..LendingConfig::default() });
    assert!(l.may_lend(0, 500) && l.may_lend(500, 500) && l.may_lend(1000, 500));
    assert!(!l.may_lend(1001, 500));
}

#[test]
fn a_slab_given_back_unasked_is_one_the_borrower_cannot_map_and_that_lender_lends_it_no_more() {
    let (mut l, now) = (lending(), Instant::now());
    let (first, _) = l.add_lender(10, 1, 4 * SLAB, now);
    l.add_borrower(1, 100, 0, SLAB, 1, now);
    let asked = l.set_want(1, 2 * SLAB, now);
    let Action::Make { ids, .. } = &asked[0] else { panic!("{asked:?}") };
    let ids = ids.clone();
    l.made(first, &ids, &[], now).unwrap();
    // Not mappable there (no peer access): given back unasked; nothing more is asked of it.
    let after = l.returned(1, &ids, now);
    assert_eq!(after.iter().filter(|a| matches!(a, Action::Release { .. })).count(), 2);
    assert!(!after.iter().any(|a| matches!(a, Action::Make { .. })), "{after:?}");
    assert!(l.rebalance(now).is_empty(), "no churn");
    // Another lender still lends to it.
    let (second, asked) = l.add_lender(11, 2, 4 * SLAB, now);
    assert!(
        matches!(&asked[..], [Action::Make { lender, ids, .. }] if *lender == second && ids.len() == 2),
        "{asked:?}"
    );
}

#[test]
fn shares_follow_the_tenants_weights_and_a_heavier_newcomer_gets_its_share_back() {
    let now = Instant::now();
    let mut l = newcomer_of_weight(3, now);
    assert_eq!((lent_to(&l, 1), lent_to(&l, 2)), (2 * SLAB, 6 * SLAB), "8 slabs shared 1:3");
    // A want below the weighted share caps it; the rest goes to the other.
    let actions = l.set_want(2, 5 * SLAB, now);
    settle_rounds(&mut l, actions, now);
    assert_eq!((lent_to(&l, 1), lent_to(&l, 2)), (3 * SLAB, 5 * SLAB));
}

#[test]
fn shares_compare_exactly_whatever_the_weights() {
    assert!(Share::of(2, 1) < Share::of(5, 2), "2/1 < 5/2");
    assert_eq!(Share::of(3, 1), Share::of(9, 3));
    assert!(Share::of(u64::MAX, 1) > Share::of(u64::MAX, 2), "no overflow");
    assert_eq!(Share::of(4, 0), Share::of(4, 1), "a weight of 0 counts as 1");
}
