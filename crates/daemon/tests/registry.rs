//! The registry without sockets: shares converge to weighted fair shares through staged
//! grants, cuts wait for `budget_met` or the deadline, leavers give everything back, and
//! status shows each viewer what it may see.

mod registry_support;

use registry_support::*;
use std::time::{Duration, Instant};
use tiermem_daemon::config::Config;
use tiermem_daemon::registry::{Outbox, Registry, TenantId};
use tiermem_protocol::{DaemonMessage, GpuId, Tier, TierBytes, TierUsage};

fn config() -> Config {
    Config::parse(
        r#"
        deadline_ms = 100
        [[gpu]]
        index = 0
        hbm = "600MiB"
        [[tenant]]
        name = "heavy"
        label = "heavy"
        weight = 2
        [[tenant]]
        name = "capped"
        label = "capped"
        quota = { hbm = "100MiB" }
        "#,
        "test",
    )
    .unwrap()
}

/// A report of `mib` MiB held in HBM by a tenant that would hold everything.
fn using(mib: u64) -> [(Tier, TierUsage); 4] {
    let hbm = TierUsage { used: mib * MIB, acquired: 0, demand: 1 << 40, reserved: 0 };
    [
        (Tier::Hbm, hbm),
        (Tier::Peer, TierUsage::default()),
        (Tier::Host, TierUsage::default()),
        (Tier::File, TierUsage::default()),
    ]
}

#[test]
fn a_lone_tenant_gets_the_gpu_and_shares_it_by_weight_when_others_come() {
    let now = Instant::now();
    let mut r = Registry::new(config(), now, 0);
    let (a, outbox) = register(&mut r, 1, None, now);
    assert_eq!(budgets(&outbox), vec![(a, 1, 600 * MIB, 600 * MIB)], "alone: the whole GPU");
    let outbox = r.usage(a, demand(1 << 40), now);
    assert!(budgets(&outbox).is_empty(), "nothing changes");

    // A tenant of weight 2 arrives: A is cut to 200 MiB at once; B gets nothing until A met it.
    let (b, outbox) = register(&mut r, 2, Some("heavy"), now);
    assert_eq!(budgets(&outbox), vec![(a, 2, 200 * MIB, 200 * MIB), (b, 1, 0, 400 * MIB)]);
    let outbox = r.budget_met(a, 2, now);
    assert_eq!(budgets(&outbox), vec![(b, 2, 400 * MIB, 400 * MIB)], "then B grows into it");

    // B asks for little: while it ramps up (it just arrived, its demand grows) it keeps its part;
    // once its demand has held still for `ramp_ms`, what it does not use is lent to A in one
    // step, and returned when B wants it back.
    let outbox = r.usage(b, demand(60 * MIB), now);
    assert!(budgets(&outbox).is_empty(), "B ramping up: nothing lent yet");
    let grew = now + Duration::from_millis(1000);
    let outbox = r.usage(b, demand(100 * MIB), grew);
    assert!(budgets(&outbox).is_empty(), "still growing");
    let (_, outbox) = r.expire_deadlines(grew + Duration::from_millis(2999));
    assert!(budgets(&outbox).is_empty(), "not held still long enough yet");
    let now = grew + Duration::from_millis(3000);
    let (_, outbox) = r.expire_deadlines(now);
    assert_eq!(budgets(&outbox), vec![(a, 3, 200 * MIB, 500 * MIB), (b, 3, 100 * MIB, 100 * MIB)]);
    let outbox = r.budget_met(b, 3, now);
    assert_eq!(budgets(&outbox), vec![(a, 4, 500 * MIB, 500 * MIB)]);
    let outbox = r.usage(b, demand(1 << 40), now);
    assert_eq!(budgets(&outbox), vec![(a, 5, 200 * MIB, 200 * MIB), (b, 4, 100 * MIB, 400 * MIB)]);
    let outbox = r.budget_met(a, 5, now);
    assert_eq!(budgets(&outbox), vec![(b, 5, 400 * MIB, 400 * MIB)]);

    // B's demand falls and grows a little once it has set up: each change takes effect at once
    // (B ramps up once, after it arrives, while it keeps growing).
    let outbox = r.usage(b, demand(100 * MIB), now);
    assert_eq!(budgets(&outbox), vec![(a, 6, 200 * MIB, 500 * MIB), (b, 6, 100 * MIB, 100 * MIB)], "lent at once");
    r.budget_met(b, 6, now);
    let outbox = r.usage(b, demand(120 * MIB), now);
    assert_eq!(budgets(&outbox), vec![(a, 8, 480 * MIB, 480 * MIB), (b, 7, 100 * MIB, 120 * MIB)], "a little back");
    r.budget_met(a, 8, now);

    // A leaves: B gets everything at once (nothing to wait for).
    let outbox = r.disconnect(a, now);
    assert_eq!(budgets(&outbox), vec![(b, 9, 600 * MIB, 600 * MIB)]);
}

#[test]
fn quotas_hold_and_the_rest_goes_to_the_others() {
    let now = Instant::now();
    let mut r = Registry::new(config(), now, 0);
    let (capped, _) = register(&mut r, 1, Some("capped"), now);
    let (other, _) = register(&mut r, 2, None, now);
    r.budget_met(capped, 2, now);
    let status = r.status(0, None, now);
    let hbm = &status.pools[0];
    let share = |id| hbm.shares.iter().find(|s| s.tenant == id).unwrap().target;
    assert_eq!((share(capped), share(other)), (100 * MIB, 500 * MIB));
}

#[test]
fn a_cut_not_met_in_time_stops_being_reserved() {
    let now = Instant::now();
    let mut r = Registry::new(config(), now, 0);
    let (a, _) = register(&mut r, 1, None, now);
    // A uses 400 MiB and never answers the cut.
    r.usage(a, using(400), now);
    let (b, outbox) = register(&mut r, 2, None, now);
    assert_eq!(budgets(&outbox), vec![(a, 2, 300 * MIB, 300 * MIB), (b, 1, 0, 300 * MIB)]);
    let (late, outbox) = r.expire_deadlines(now + Duration::from_millis(50));
    assert!(late.is_empty() && outbox.is_empty(), "not yet");
    let (late, outbox) = r.expire_deadlines(now + Duration::from_millis(150));
    assert_eq!(late, vec![a]);
    // A is counted at the 400 MiB it reports using: B gets the other 200 for now.
    assert_eq!(budgets(&outbox), vec![(b, 2, 200 * MIB, 300 * MIB)]);
    assert!(r.status(0, None, now).tenants.iter().any(|t| t.tenant == a && t.late));
    // A gives memory back after all: what it holds follows its use down, and B grows.
    let outbox = r.usage(a, using(300), now);
    assert_eq!(budgets(&outbox), vec![(b, 3, 300 * MIB, 300 * MIB)]);
}

#[test]
fn acquired_memory_is_a_floor() {
    let now = Instant::now();
    let mut r = Registry::new(config(), now, 0);
    let (a, _) = register(&mut r, 1, None, now);
    let pinned = TierUsage { used: 500 * MIB, acquired: 500 * MIB, demand: 1 << 40, reserved: 0 };
    r.usage(
        a,
        [
            (Tier::Hbm, pinned),
            (Tier::Peer, TierUsage::default()),
            (Tier::Host, TierUsage::default()),
            (Tier::File, TierUsage::default()),
        ],
        now,
    );
    let (b, outbox) = register(&mut r, 2, None, now);
    assert_eq!(
        budgets(&outbox),
        vec![(a, 2, 500 * MIB, 500 * MIB), (b, 1, 0, 100 * MIB)],
        "A keeps its 500 acquired MiB"
    );
    assert_eq!(budgets(&r.budget_met(a, 2, now)), vec![(b, 2, 100 * MIB, 100 * MIB)]);
}

#[test]
fn status_shows_others_only_to_those_allowed() {
    let now = Instant::now();
    let mut r = Registry::new(config(), now, 500);
    let (a, _) = register(&mut r, 1, None, now);
    let (_b, _) = register(&mut r, 2, None, now);
    r.budget_met(a, 2, now);
    let own = r.status(1, Some(a), now);
    assert_eq!((own.tenants.len(), own.hidden_tenants), (1, 1));
    assert_eq!(own.pools[0].shares.len(), 1);
    assert_eq!(own.pools[0].budgeted, 600 * MIB, "hidden tenants still count in the totals");
    assert_eq!(r.status(0, None, now).tenants.len(), 2, "root");
    assert_eq!(r.status(500, None, now).tenants.len(), 2, "the daemon's user");
    assert_eq!(r.status(3, None, now).tenants.len(), 0, "a stranger");
}

#[test]
fn memory_nobody_demands_is_headroom_taken_back_first() {
    let now = Instant::now();
    let mut r = Registry::new(config(), now, 0);
    let (a, _) = register(&mut r, 1, None, now);
    let (b, _) = register(&mut r, 2, None, now);
    r.budget_met(a, 2, now);
    r.usage(a, demand(100 * MIB), now);
    r.usage(b, demand(50 * MIB), now);
    let now = now + Duration::from_millis(3000);
    r.expire_deadlines(now);
    let target =
        |r: &Registry, id| r.status(0, None, now).pools[0].shares.iter().find(|s| s.tenant == id).unwrap().target;
    assert_eq!((target(&r, a), target(&r, b)), (300 * MIB, 300 * MIB), "both want little: halves as headroom");
    let outbox = r.usage(a, demand(1 << 40), now);
    let sent = |outbox: &Outbox| budgets(outbox).iter().map(|m| (m.0, m.2, m.3)).collect::<Vec<_>>();
    assert_eq!(sent(&outbox), vec![(a, 300 * MIB, 550 * MIB), (b, 50 * MIB, 50 * MIB)]);
    let outbox = r.budget_met(b, budgets(&outbox)[1].1, now);
    assert_eq!(sent(&outbox), vec![(a, 550 * MIB, 550 * MIB)]);
}

#[test]
fn a_tenant_lying_about_what_it_holds_cannot_take_more_than_it_was_given() {
    let now = Instant::now();
    let mut r = Registry::new(config(), now, 0);
    let (a, _) = register(&mut r, 1, None, now);
    r.usage(a, demand(1 << 40), now);
    let (b, _) = register(&mut r, 2, None, now);
    // B claims to hold the whole machine acquired: it was given nothing yet, so it pins nothing.
    let everything = TierUsage { used: u64::MAX, acquired: u64::MAX, demand: u64::MAX, reserved: 0 };
    let lie = [(Tier::Hbm, everything), (Tier::Peer, everything), (Tier::Host, everything), (Tier::File, everything)];
    r.usage(b, lie, now);
    r.budget_met(a, 2, now);
    let status = r.status(0, None, now);
    let target = |id| status.pools[0].shares.iter().find(|s| s.tenant == id).unwrap().target;
    assert_eq!((target(a), target(b)), (300 * MIB, 300 * MIB));
    assert_eq!(status.pools[0].used, u64::MAX, "sums saturate");
    // A third tenant comes: B's claimed pins count only up to the 300 MiB it was given, and
    // the others share the rest; nothing is promised twice.
    let (c, _) = register(&mut r, 3, None, now);
    r.usage(c, demand(1 << 40), now);
    r.budget_met(a, 10, now);
    let status = r.status(0, None, now);
    let budget = |id| status.pools[0].shares.iter().find(|s| s.tenant == id).unwrap().budget;
    assert_eq!((budget(a), budget(b), budget(c)), (150 * MIB, 300 * MIB, 150 * MIB));
    assert!(status.pools[0].budgeted <= 600 * MIB, "never promised twice: {:?}", status.pools[0]);
}

#[test]
fn tenants_reconnecting_to_a_restarted_daemon_keep_what_they_hold_until_they_give_it_back() {
    let now = Instant::now();
    let mut r = Registry::new(config(), now, 0);
    let holding = |mib: u64| [TierBytes { tier: Tier::Hbm, bytes: mib * MIB }];
    let (a, _, outbox) = r.register(who(1, None), joining(gpu(), &[], &holding(400)), now);
    assert_eq!(budgets(&outbox), vec![(a, 1, 600 * MIB, 600 * MIB)]);
    let (b, _, outbox) = r.register(who(2, None), joining(gpu(), &[], &holding(200)), now);
    // A is cut to its half; B keeps its 200 MiB and grows only once A has given back.
    assert_eq!(budgets(&outbox), vec![(a, 2, 300 * MIB, 300 * MIB), (b, 1, 200 * MIB, 300 * MIB)]);
    assert_eq!(budgets(&r.budget_met(a, 2, now)), vec![(b, 2, 300 * MIB, 300 * MIB)]);
}

/// The budget of `tier` each message gives, by tenant.
fn tier_budgets(outbox: &Outbox, tier: Tier) -> Vec<(TenantId, u64)> {
    outbox
        .iter()
        .filter_map(|(id, m)| match m {
            DaemonMessage::Budget { tiers, .. } => tiers.iter().find(|t| t.tier == tier).map(|t| (*id, t.bytes)),
            _ => None,
        })
        .collect()
}

#[test]
fn neighbours_lent_hbm_is_shared_out_by_weight_when_configured() {
    let now = Instant::now();
    let config =
        Config::parse("[tiers]\npeer = \"600MiB\"\n[[tenant]]\nname = \"heavy\"\nlabel = \"heavy\"\nweight = 2", "t")
            .unwrap();
    let mut r = Registry::new(config, now, 0);
    let borrowing = |bytes: u64| {
        let peer = TierUsage { used: 0, acquired: 0, demand: bytes, reserved: 0 };
        [
            (Tier::Hbm, TierUsage::default()),
            (Tier::Peer, peer),
            (Tier::Host, TierUsage::default()),
            (Tier::File, TierUsage::default()),
        ]
    };
    let wants = [TierBytes { tier: Tier::Peer, bytes: 1 << 40 }];
    let (a, _, outbox) = r.register(who(1, None), joining(gpu(), &wants, &[]), now);
    assert_eq!(tier_budgets(&outbox, Tier::Peer), vec![(a, 600 * MIB)], "alone: all that is lent");
    r.usage(a, borrowing(1 << 40), now);
    let (b, _, outbox) = r.register(who(2, Some("heavy")), joining(gpu(), &wants, &[]), now);
    assert_eq!(tier_budgets(&outbox, Tier::Peer), vec![(a, 200 * MIB), (b, 0)], "A gives back first");
    let later = r.usage(b, borrowing(1 << 40), now);
    let seq = budgets(&outbox).into_iter().chain(budgets(&later)).filter(|m| m.0 == a).map(|m| m.1).max().unwrap();
    let outbox = r.budget_met(a, seq, now);
    assert_eq!(tier_budgets(&outbox, Tier::Peer), vec![(b, 400 * MIB)], "then B borrows its share");
    // A tenant that borrows nothing (no neighbour lends to it) leaves its share to the other.
    let outbox = r.usage(b, borrowing(0), now);
    assert_eq!(tier_budgets(&outbox, Tier::Peer), vec![(a, 200 * MIB), (b, 0)]);
}

#[test]
fn a_newcomer_whose_hbm_grant_is_staged_claims_neighbours_hbm_by_its_target() {
    // GPU 0 shares 600 MiB, neighbours lend 600. A (alone: 600 of HBM, 600 lent) needs more than
    // both. B arrives wanting 400 MiB: its HBM target is 300, but it holds nothing until A gives
    // back, so it reports all 400 as what it would borrow. Claimed by its target, B needs 100
    // of neighbours' HBM, and A keeps 500 (by its report now, both would get 300).
    let now = Instant::now();
    let config = Config::parse("[tiers]\npeer = \"600MiB\"\n[[gpu]]\nindex = 0\nhbm = \"600MiB\"", "t").unwrap();
    let mut r = Registry::new(config, now, 0);
    let report = |hbm_demand: u64, peer_demand: u64| {
        [
            (Tier::Hbm, TierUsage { used: 0, acquired: 0, demand: hbm_demand * MIB, reserved: 0 }),
            (Tier::Peer, TierUsage { used: 0, acquired: 0, demand: peer_demand * MIB, reserved: 0 }),
            (Tier::Host, TierUsage::default()),
            (Tier::File, TierUsage::default()),
        ]
    };
    let wants = [TierBytes { tier: Tier::Peer, bytes: 1 << 40 }];
    let (a, _, _) = r.register(who(1, None), joining(gpu(), &wants, &[]), now);
    r.usage(a, report(2000, 1400), now);
    let later = now + Duration::from_secs(10); // past A's ramp-up
    r.usage(a, report(2000, 1400), later);
    let (b, _, outbox) = r.register(who(2, None), joining(gpu(), &wants, &[]), later);
    let mut all = outbox;
    all.extend(r.usage(b, report(400, 400), later));
    let hbm: Vec<_> = budgets(&all).into_iter().filter(|m| m.0 == b).collect();
    assert_eq!(hbm.last().map(|m| (m.2, m.3)), Some((0, 300 * MIB)), "B's HBM grant staged: {hbm:?}");
    let peer = tier_budgets(&all, Tier::Peer);
    assert_eq!(peer.iter().rev().find(|m| m.0 == a).map(|m| m.1), Some(500 * MIB), "{peer:?}");
}

/// A registry and a real GPU of `total` bytes with no capacity configured and no reserve: the
/// census alone decides what is shared out.
fn census_only(total: u64, now: Instant) -> (Registry, GpuId) {
    let mut config = config();
    config.gpus.clear();
    config.hbm_reserve = tiermem_daemon::config::Size(0);
    let real = GpuId { index: 0, uuid: Some("GPU-test".into()), total_bytes: total, simulated: false };
    (Registry::new(config, now, 0), real)
}

#[test]
fn the_drivers_census_limits_the_capacity_to_what_other_users_leave_and_status_adds_it_up() {
    use tiermem_daemon::census::{Census, MARGIN, SAMPLES};
    let now = Instant::now();
    let (mut r, real) = census_only(1 << 30, now);
    let (a, _, outbox) = r.register(who(1, None), joining(real.clone(), &[], &[]), now);
    assert_eq!(budgets(&outbox), vec![(a, 1, 1 << 30, 1 << 30)], "no census yet: the whole GPU");
    assert_eq!(r.census_gpus(), vec![(0, "GPU-test".to_owned())]);
    r.usage(a, using(300), now);
    // Its process holds 100 MiB beyond its 300 MiB of chunks (a CUDA context); another
    // process, no tenant, holds 200 MiB.
    let census =
        Census { total: 1 << 30, used: 600 * MIB, processes: vec![(101, Some(400 * MIB)), (7, Some(200 * MIB))] };
    let mut outbox = Vec::new();
    for _ in 0..SAMPLES {
        outbox.extend(r.record_census(0, &census, now));
    }
    let capacity = (1 << 30) - 100 * MIB - 200 * MIB - MARGIN;
    assert_eq!(budgets(&outbox), vec![(a, 2, capacity, capacity)], "cut to what the others leave");
    let status = r.status(0, None, now);
    let hbm = &status.pools[0];
    let driver = hbm.driver.as_ref().expect("the driver's accounts");
    assert_eq!(
        (hbm.capacity, driver.others, driver.overhead, driver.note.as_deref()),
        (capacity, 200 * MIB, 100 * MIB, None)
    );
    assert_eq!(
        hbm.used + driver.overhead + driver.others,
        driver.used,
        "chunks + overhead + others = the driver's used"
    );
    assert_eq!(status.tenants[0].overhead, Some(100 * MIB));
    // The other process exits: the capacity comes back at the next census.
    let census = Census { total: 1 << 30, used: 400 * MIB, processes: vec![(101, Some(400 * MIB))] };
    let outbox = r.record_census(0, &census, now);
    assert_eq!(budgets(&outbox)[0].3, (1 << 30) - 100 * MIB - MARGIN);
}

/// A registry whose tenants are idle after 1 s, with tenants A and B registered at `t0`, and
/// transfer counters of `acquires` acquires, the largest of `largest` bytes.
fn idle_setup(
    t0: Instant,
    largest: u64,
) -> (Registry, TenantId, TenantId, impl Fn(u64) -> tiermem_protocol::TransferCounters) {
    let mut config = config();
    config.idle_after_ms = 1000;
    // These tests are about idleness: tenants whose demand just grew lend at once.
    config.ramp_ms = 0;
    let mut r = Registry::new(config, t0, 0);
    let (a, _) = register(&mut r, 1, None, t0);
    let (b, _) = register(&mut r, 2, None, t0);
    let counters = move |acquires: u64| tiermem_protocol::TransferCounters {
        acquires,
        largest_acquire_bytes: largest,
        ..Default::default()
    };
    (r, a, b, counters)
}

/// A and B of [`idle_setup`] meet their first budgets at `t0` and report working, each
/// demanding more than the GPU.
fn both_working(r: &mut Registry, a: TenantId, b: TenantId, counters: tiermem_protocol::TransferCounters, t0: Instant) {
    for (id, seq) in [(a, 2), (b, 1)] {
        r.budget_met(id, seq, t0);
        r.record_transfers(id, counters, t0);
        r.usage(id, demand(1 << 40), t0);
    }
}

#[test]
fn an_idle_tenant_lends_all_but_its_largest_acquire_until_it_acquires_again() {
    let t0 = Instant::now();
    let (mut r, a, b, counters) = idle_setup(t0, 40 * MIB);
    both_working(&mut r, a, b, counters(1), t0);
    let target =
        |r: &Registry, id| r.status(0, None, t0).pools[0].shares.iter().find(|s| s.tenant == id).unwrap().target;
    assert_eq!((target(&r, a), target(&r, b)), (300 * MIB, 300 * MIB), "two working tenants: halves");

    // B goes on acquiring; A stops. After idle_after_ms, A keeps its largest acquire.
    let t1 = t0 + Duration::from_millis(600);
    r.record_transfers(b, counters(50), t1);
    r.usage(b, demand(1 << 40), t1);
    let (_, outbox) = r.expire_deadlines(t1);
    assert!(budgets(&outbox).is_empty(), "not idle yet");
    // A's link still reports (its heartbeat), the acquire count unchanged.
    let heartbeat = t0 + Duration::from_millis(900);
    r.record_transfers(a, counters(1), heartbeat);
    assert!(budgets(&r.usage(a, demand(1 << 40), heartbeat)).is_empty(), "not idle yet");
    let t2 = t0 + Duration::from_millis(1000);
    let (_, outbox) = r.expire_deadlines(t2);
    assert_eq!(budgets(&outbox).iter().map(|m| (m.0, m.3)).collect::<Vec<_>>(), vec![(a, 40 * MIB), (b, 560 * MIB)]);
    let status = r.status(0, None, t2);
    assert!(status.tenants.iter().find(|t| t.tenant == a).unwrap().idle);
    // The idle tenant lends what the working one borrows (their own parts are by weight).
    let share = |id| status.pools[0].shares.iter().find(|s| s.tenant == id).unwrap().clone();
    assert_eq!((share(a).lent, share(a).borrowed), (260 * MIB, 0));
    assert_eq!((share(b).lent, share(b).borrowed), (0, 260 * MIB));

    // A acquires again: its share comes back (B is cut, A grows once B has met it).
    let t3 = t0 + Duration::from_millis(1500);
    r.record_transfers(b, counters(90), t3);
    r.record_transfers(a, counters(2), t3);
    let outbox = r.usage(a, demand(1 << 40), t3);
    assert_eq!(budgets(&outbox).iter().map(|m| (m.0, m.3)).collect::<Vec<_>>(), vec![(a, 300 * MIB), (b, 300 * MIB)]);
    assert!(!r.status(0, None, t3).tenants.iter().find(|t| t.tenant == a).unwrap().idle);
}

#[test]
fn a_tenant_not_heard_from_is_not_taken_for_idle() {
    // A's link is busy (meeting a cut) or its process stalled: no report for 1.5 s while B works. Its
    // acquire count has not moved, but nothing says it stopped: it keeps its half. Once a
    // report comes with the count still unchanged, it is idle.
    let t0 = Instant::now();
    let (mut r, a, b, counters) = idle_setup(t0, 40 * MIB);
    both_working(&mut r, a, b, counters(1), t0);
    for ms in [500, 1000, 1500] {
        let t = t0 + Duration::from_millis(ms);
        r.record_transfers(b, counters(ms), t);
        r.usage(b, demand(1 << 40), t);
        let (_, outbox) = r.expire_deadlines(t);
        assert!(budgets(&outbox).is_empty(), "at {ms} ms A is silent, not idle");
        assert!(!r.status(0, None, t).tenants.iter().find(|s| s.tenant == a).unwrap().idle);
    }
    let t = t0 + Duration::from_millis(1600);
    r.record_transfers(a, counters(1), t);
    let outbox = r.usage(a, demand(1 << 40), t);
    assert_eq!(budgets(&outbox).iter().map(|m| (m.0, m.3)).collect::<Vec<_>>(), vec![(a, 40 * MIB), (b, 560 * MIB)]);
    assert!(r.status(0, None, t).tenants.iter().find(|s| s.tenant == a).unwrap().idle);
}

#[test]
fn an_idle_tenant_keeps_what_the_working_ones_do_not_demand() {
    let t0 = Instant::now();
    let (mut r, a, b, counters) = idle_setup(t0, 4 * MIB);
    r.budget_met(a, 2, t0);
    r.record_transfers(a, counters(1), t0);
    r.usage(a, demand(400 * MIB), t0);
    let t1 = t0 + Duration::from_millis(1500);
    r.record_transfers(a, counters(1), t1); // A's heartbeat: still no acquire
    r.usage(a, demand(400 * MIB), t1);
    r.record_transfers(b, counters(9), t1);
    r.usage(b, demand(100 * MIB), t1);
    r.expire_deadlines(t1);
    let status = r.status(0, None, t1);
    let target = |id| status.pools[0].shares.iter().find(|s| s.tenant == id).unwrap().target;
    assert!(status.tenants.iter().find(|t| t.tenant == a).unwrap().idle);
    assert!(
        target(a) >= 400 * MIB && target(b) >= 100 * MIB,
        "A idle keeps all it demands: {} / {}",
        target(a),
        target(b)
    );
}

#[test]
fn a_tenant_that_has_allocated_nothing_yet_keeps_its_share_from_a_hog() {
    let now = Instant::now();
    let mut r = Registry::new(config(), now, 0);
    let (hog, _) = register(&mut r, 1, None, now);
    r.usage(hog, using(600), now);
    let (newcomer, _) = register(&mut r, 2, None, now);
    // Its first report: nothing allocated yet. Its share stays reserved for it.
    let outbox = r.usage(newcomer, demand(0), now);
    assert!(budgets(&outbox).iter().all(|m| m.0 != hog || m.3 == 300 * MIB), "{:?}", budgets(&outbox));
    let target =
        |r: &Registry, id| r.status(0, None, now).pools[0].shares.iter().find(|s| s.tenant == id).unwrap().target;
    assert_eq!((target(&r, hog), target(&r, newcomer)), (300 * MIB, 300 * MIB));
    // Once it has allocated, and its demand has held still for `ramp_ms`, what it does not use
    // goes to the hog.
    r.usage(newcomer, demand(100 * MIB), now);
    assert_eq!((target(&r, hog), target(&r, newcomer)), (300 * MIB, 300 * MIB), "ramping up");
    let now = now + Duration::from_millis(3000);
    r.expire_deadlines(now);
    assert_eq!((target(&r, hog), target(&r, newcomer)), (500 * MIB, 100 * MIB));
}

/// Tenants A and B on `real`, 200 MiB of chunks each, whose processes hold 300 MiB (a large
/// library workspace) and 100 MiB beyond them, over enough censuses to count; returns their
/// ids and the budgets sent meanwhile.
fn uneven_overheads(r: &mut Registry, real: &GpuId, now: Instant) -> (TenantId, TenantId, Outbox) {
    use tiermem_daemon::census::{Census, SAMPLES};
    let (a, _, _) = r.register(who(1, None), joining(real.clone(), &[], &[]), now);
    let (b, _, _) = r.register(who(2, None), joining(real.clone(), &[], &[]), now);
    r.usage(a, using(200), now);
    r.usage(b, using(200), now);
    let census =
        Census { total: 2 << 30, used: 800 * MIB, processes: vec![(101, Some(500 * MIB)), (102, Some(300 * MIB))] };
    let mut outbox = Vec::new();
    for _ in 0..SAMPLES {
        outbox.extend(r.record_census(0, &census, now));
    }
    (a, b, outbox)
}

#[test]
fn each_tenant_is_charged_its_own_overhead_so_a_heavy_context_does_not_shrink_the_others() {
    use tiermem_daemon::census::{Census, MARGIN};
    let now = Instant::now();
    let (mut r, real) = census_only(2 << 30, now);
    let (a, b, mut outbox) = uneven_overheads(&mut r, &real, now);
    // Both meet every budget they are sent (A first gave back what it held alone).
    for _ in 0..4 {
        let sent: Vec<(TenantId, u64)> = budgets(&outbox).into_iter().map(|(id, seq, ..)| (id, seq)).collect();
        for (id, seq) in sent {
            outbox.extend(r.budget_met(id, seq, now));
        }
    }
    // Each gets half of what other users leave, its own overhead taken from its half.
    let half = ((2 << 30) - MARGIN) / 2;
    let last = |id| budgets(&outbox).into_iter().rfind(|&(t, ..)| t == id).map(|(_, _, bytes, _)| bytes);
    assert_eq!((last(a), last(b)), (Some(half - 300 * MIB), Some(half - 100 * MIB)));
    let status = r.status(0, None, now);
    let driver = status.pools[0].driver.as_ref().expect("the driver's accounts");
    assert_eq!(driver.overhead, 400 * MIB);
    assert_eq!(status.pools[0].capacity, (2 << 30) - 400 * MIB - MARGIN, "the chunks' capacity is as before");
    // Overheads wandering by a few MiB move no budget (each census would otherwise evict).
    for wander in [10, 30, 20, 40, 10] {
        let processes = vec![(101, Some((500 + wander) * MIB)), (102, Some((300 - wander) * MIB))];
        let outbox = r.record_census(0, &Census { total: 2 << 30, used: 800 * MIB, processes }, now);
        assert!(budgets(&outbox).is_empty(), "a census {wander} MiB off sent {:?}", budgets(&outbox));
    }
}

#[test]
fn overheads_are_not_charged_where_the_configured_capacity_binds_rather_than_the_driver() {
    let now = Instant::now();
    let mut r = Registry::new(config(), now, 0); // GPU 0 shares 600 MiB, far below what the census leaves
    let real = GpuId { index: 0, uuid: Some("GPU-test".into()), total_bytes: 2 << 30, simulated: false };
    uneven_overheads(&mut r, &real, now);
    let status = r.status(0, None, now);
    let targets: Vec<u64> = status.pools[0].shares.iter().map(|s| s.target).collect();
    assert_eq!(targets, vec![300 * MIB, 300 * MIB], "the overheads take nothing from the 600 MiB configured");
}
