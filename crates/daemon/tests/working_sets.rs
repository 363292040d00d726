//! The registry with `hbm_sharing = "working-sets"` (registry/turns.rs):
//! as many whole working sets as fit run, the others keep a little and wait; turns pass to the
//! tenant that waited longest; priority goes first; a leaver's turn passes at once; tenants
//! that can wait (programs under `tiermem run`) are told to while they wait.

mod registry_support;

use registry_support::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tiermem_daemon::config::Config;
use tiermem_daemon::registry::{Joining, Outbox, Registry, TenantId};
use tiermem_protocol::DaemonMessage;

/// Turns of 1 s on 600 MiB, an urgent label; tenants set up at once (`ramp_ms = 0`) unless
/// `extra` says otherwise.
fn config(extra: &str) -> Config {
    let ramp = if extra.contains("ramp_ms") { "" } else { "ramp_ms = 0" };
    let text = format!(
        "hbm_sharing = \"working-sets\"\nturn_ms = 1000\n{ramp}\n{extra}\n[[gpu]]\nindex = 0\nhbm = \"600MiB\"\n\
         [[tenant]]\nname = \"urgent\"\nlabel = \"urgent\"\npriority = 5\n"
    );
    Config::parse(&text, "test").unwrap()
}

/// A tenant working over `mib` MiB, acquiring 20 MiB at a time.
fn working(r: &mut Registry, uid: u32, label: Option<&str>, mib: u64, now: Instant) -> (TenantId, Outbox) {
    let (id, mut outbox) = register(r, uid, label, now);
    acquiring(r, id, 1, now);
    outbox.extend(r.usage(id, demand(mib * MIB), now));
    (id, outbox)
}

/// A registry under `config` at `t0` with a working tenant per entry of `mib` (uids 1, 2, …),
/// every budget settled: the registry, the tenants, their budgets.
fn settled(config: Config, mib: &[u64], t0: Instant) -> (Registry, Vec<TenantId>, BTreeMap<TenantId, u64>) {
    let mut r = Registry::new(config, t0, 0);
    let mut outbox = Vec::new();
    let mut ids = Vec::new();
    for (uid, &mib) in (1..).zip(mib) {
        let (id, sent) = working(&mut r, uid, None, mib, t0);
        ids.push(id);
        outbox.extend(sent);
    }
    let budgets = settle(&mut r, outbox, t0);
    (r, ids, budgets)
}

fn waiting(r: &Registry, now: Instant) -> Vec<TenantId> {
    r.status(0, None, now).tenants.iter().filter(|t| t.waiting).map(|t| t.tenant).collect()
}

#[test]
fn one_working_set_runs_whole_while_the_others_share_the_rest_and_turns_pass_to_who_waited_longest() {
    let t0 = Instant::now();
    let (mut r, ids, budgets) = settled(config(""), &[360, 360, 360], t0);
    let (a, b, c) = (ids[0], ids[1], ids[2]);
    assert_eq!((budgets[&a], budgets[&b], budgets[&c]), (360 * MIB, 120 * MIB, 120 * MIB), "A whole, B and C share");
    assert_eq!(waiting(&r, t0), vec![b, c]);

    // A's turn runs out with others waiting: B (least time admitted, then the oldest) goes next.
    let (_, outbox) = r.expire_deadlines(t0 + Duration::from_millis(999));
    assert!(outbox.is_empty(), "A's turn has not run out");
    let t1 = t0 + Duration::from_millis(1000);
    let (_, outbox) = r.expire_deadlines(t1);
    let budgets = settle(&mut r, outbox, t1);
    assert_eq!((budgets[&a], budgets[&b]), (120 * MIB, 360 * MIB));
    assert_eq!(waiting(&r, t1), vec![a, c]);
    // Then C, who has waited all along, not A again.
    let t2 = t1 + Duration::from_millis(1000);
    let (_, outbox) = r.expire_deadlines(t2);
    let budgets = settle(&mut r, outbox, t2);
    assert_eq!((budgets[&b], budgets[&c]), (120 * MIB, 360 * MIB));
    assert_eq!(waiting(&r, t2), vec![a, b]);

    // C leaves: the turn passes at once to the one that has had least of them (A: 1 s, B: 1 s,
    // then the oldest), and the other grows into what is left.
    let outbox = r.disconnect(c, t2);
    let budgets = settle(&mut r, outbox, t2);
    assert_eq!((budgets[&a], budgets[&b]), (360 * MIB, 240 * MIB));
    assert_eq!(waiting(&r, t2), vec![b]);
}

#[test]
fn working_sets_that_all_fit_are_shared_as_fair_share_does() {
    let t0 = Instant::now();
    let (r, ids, budgets) = settled(config(""), &[200, 300], t0);
    let (a, b) = (ids[0], ids[1]);
    // Both whole, and the 100 MiB nobody demands spread on top as headroom (water-filled).
    assert_eq!((budgets[&a], budgets[&b]), (300 * MIB, 300 * MIB));
    assert!(waiting(&r, t0).is_empty());
}

#[test]
fn priority_comes_before_turns_and_a_hog_never_gets_a_turn() {
    let t0 = Instant::now();
    let (mut r, ids, budgets) = settled(config(""), &[4000, 360], t0);
    let (hog, a) = (ids[0], ids[1]);
    assert_eq!((budgets[&hog], budgets[&a]), (240 * MIB, 360 * MIB), "the one that fits runs whole");
    // An urgent tenant arrives: it is admitted over A's turn; A keeps a little beside the hog.
    let (urgent, outbox) = working(&mut r, 3, Some("urgent"), 400, t0);
    let budgets = settle(&mut r, outbox, t0);
    assert_eq!(budgets[&urgent], 400 * MIB);
    assert_eq!(budgets[&a] + budgets[&hog], 200 * MIB);
    assert!(budgets[&a] >= 40 * MIB && budgets[&hog] >= 40 * MIB, "each keeps twice its largest acquire");
    // Its turn never passes to a lower priority.
    let later = t0 + Duration::from_secs(5);
    let (_, outbox) = r.expire_deadlines(later);
    let budgets = settle(&mut r, outbox, later);
    assert!(!budgets.contains_key(&urgent) || budgets[&urgent] == 400 * MIB);
    assert_eq!(waiting(&r, later), vec![hog, a]);
}

#[test]
fn time_alone_is_not_held_against_a_tenant_when_others_come() {
    // A runs alone for an hour, then B comes: A's turn starts then, and turns alternate each
    // `turn_ms` — A does not wait an hour for having had the GPU to itself.
    let t0 = Instant::now();
    let (mut r, ids, _) = settled(config(""), &[360], t0);
    let a = ids[0];
    let hour = t0 + Duration::from_secs(3600);
    acquiring(&mut r, a, 2, hour);
    let (_, outbox) = r.expire_deadlines(hour);
    settle(&mut r, outbox, hour);
    let (b, outbox) = working(&mut r, 2, None, 360, hour);
    let budgets = settle(&mut r, outbox, hour);
    assert_eq!(budgets.get(&b), Some(&(240 * MIB)), "A keeps its turn, B the rest: {budgets:?}");
    assert_eq!(waiting(&r, hour), vec![b]);
    let mut now = hour;
    for (k, (admitted, waits)) in [(b, a), (a, b), (b, a)].into_iter().enumerate() {
        acquiring(&mut r, a, 3 + k as u64, now);
        acquiring(&mut r, b, 3 + k as u64, now);
        let (_, outbox) = r.expire_deadlines(now + Duration::from_millis(999));
        assert!(outbox.is_empty(), "the turn has not run out");
        now += Duration::from_millis(1000);
        let (_, outbox) = r.expire_deadlines(now);
        let budgets = settle(&mut r, outbox, now);
        assert_eq!((budgets[&admitted], budgets[&waits]), (360 * MIB, 240 * MIB));
        assert_eq!(waiting(&r, now), vec![waits]);
    }
}

#[test]
fn a_lone_tenant_larger_than_the_gpu_has_it_all_and_does_not_wait() {
    let t0 = Instant::now();
    let (r, ids, budgets) = settled(config(""), &[4000], t0);
    assert_eq!(budgets[&ids[0]], 600 * MIB);
    assert!(waiting(&r, t0).is_empty(), "nobody else has a turn");
}

#[test]
fn fair_share_stays_the_default() {
    let t0 = Instant::now();
    let fair = Config::parse("ramp_ms = 0\n[[gpu]]\nindex = 0\nhbm = \"600MiB\"\n", "test").unwrap();
    let (r, ids, budgets) = settled(fair, &[360, 360, 360], t0);
    assert!(ids.iter().all(|id| budgets[id] == 200 * MIB), "{budgets:?}");
    assert!(waiting(&r, t0).is_empty());
}

/// The `wait` each budget in `outbox` carries, by tenant (the last one wins).
fn waits(outbox: &Outbox) -> BTreeMap<TenantId, bool> {
    said(outbox, |m| matches!(m, DaemonMessage::Budget { wait: true, .. }))
}

/// The `others_wait` each budget in `outbox` carries, by tenant (the last one wins).
fn others_wait(outbox: &Outbox) -> BTreeMap<TenantId, bool> {
    said(outbox, |m| matches!(m, DaemonMessage::Budget { others_wait: true, .. }))
}

fn said(outbox: &Outbox, word: impl Fn(&DaemonMessage) -> bool) -> BTreeMap<TenantId, bool> {
    outbox.iter().filter(|(_, m)| matches!(m, DaemonMessage::Budget { .. })).map(|(id, m)| (*id, word(m))).collect()
}

#[test]
fn a_program_that_can_wait_is_held_while_it_waits_and_until_the_memory_of_its_turn_is_given_back() {
    let t0 = Instant::now();
    let mut r = Registry::new(config("idle_after_ms = 300"), t0, 0);
    let (a, mut outbox) = program(&mut r, 1, 360, t0);
    let (b, sent) = program(&mut r, 2, 360, t0);
    outbox.extend(sent);
    // An engine's tenant waiting beside them is never told to: it cannot be held.
    let (engine, sent) = working(&mut r, 3, None, 250, t0);
    outbox.extend(sent);
    // A, whose working set fits what it has, runs on while the others give back what they got
    // before their reports came.
    assert_ne!(waits(&outbox).get(&a), Some(&true), "A was held while its working set fit its budget");
    assert!(!held(&r, t0).contains(&a));
    let settled = settle(&mut r, outbox, t0);
    assert_eq!(settled[&a], 360 * MIB, "A has its turn");
    assert_eq!(waiting(&r, t0), vec![b, engine]);
    assert_eq!(held(&r, t0), vec![b], "B waits, held; the engine waits, running");
    // Held, B keeps only room for twice its largest acquire; what A leaves goes to the engine.
    assert_eq!((settled[&b], settled[&engine]), (40 * MIB, 200 * MIB));

    // Held, B launches nothing, so its acquire count stands still: that is not idleness.
    let mut t = t0;
    for _ in 0..9 {
        t += Duration::from_millis(100);
        acquiring(&mut r, b, 1, t);
        acquiring(&mut r, a, (t - t0).as_millis() as u64, t);
        acquiring(&mut r, engine, (t - t0).as_millis() as u64, t);
        let (_, outbox) = r.expire_deadlines(t);
        settle(&mut r, outbox, t);
    }
    assert!(r.status(0, None, t).tenants.iter().all(|s| !s.idle), "a held tenant was taken for idle");

    // A's turn (1 s) ends: A is cut and held at once; B's turn has begun, but B stays held while A
    // still holds the memory B is to get.
    t += Duration::from_millis(100);
    acquiring(&mut r, a, 1000, t);
    let (_, outbox) = r.expire_deadlines(t);
    let told = waits(&outbox);
    assert_eq!(told.get(&a), Some(&true), "A, its turn over, is told to wait: {told:?}");
    assert_ne!(told.get(&b), Some(&false), "B runs before A gave back its memory: {told:?}");
    assert_eq!(held(&r, t), vec![a, b]);
    // A takes longer than a turn to give its memory back: B's turn is not spent meanwhile.
    for _ in 0..15 {
        t += Duration::from_millis(100);
        acquiring(&mut r, engine, (t - t0).as_millis() as u64, t);
        let (_, outbox) = r.expire_deadlines(t);
        assert_ne!(waits(&outbox).get(&b), Some(&false), "B ran before A gave its memory back");
    }
    assert_eq!(waiting(&r, t), vec![a, engine], "B's turn ran out while it waited for its memory");
    assert_eq!(held(&r, t), vec![a, b]);
    // A meets its cut: B's budget grows to its whole working set and B may run.
    let cut = budgets(&outbox).into_iter().find(|&(id, ..)| id == a).expect("A's cut");
    let outbox = r.budget_met(a, cut.1, t);
    let told = waits(&outbox);
    assert_eq!(told.get(&b), Some(&false), "B runs once its memory is given back: {told:?}");
    assert_eq!(budgets(&outbox).iter().find(|&&(id, ..)| id == b).map(|s| s.2), Some(360 * MIB));
    assert_eq!(held(&r, t), vec![a]);

    // B leaves: the engine, which has waited all along, has its turn; A still waits, held.
    let outbox = r.disconnect(b, t);
    settle(&mut r, outbox, t);
    assert_eq!(waiting(&r, t), vec![a]);
    assert_eq!(held(&r, t), vec![a]);
    // The engine leaves too: A runs whole, and nobody is held.
    let outbox = r.disconnect(engine, t);
    assert_eq!(waits(&outbox).get(&a), Some(&false));
    settle(&mut r, outbox, t);
    assert!(held(&r, t).is_empty());
}

#[test]
fn under_fair_share_no_program_is_ever_held() {
    let t0 = Instant::now();
    let text = "hbm_sharing = \"fair\"\n[[gpu]]\nindex = 0\nhbm = \"600MiB\"\n";
    let mut r = Registry::new(Config::parse(text, "test").unwrap(), t0, 0);
    let (_, mut outbox) = program(&mut r, 1, 360, t0);
    let (_, sent) = program(&mut r, 2, 360, t0);
    outbox.extend(sent);
    assert!(waits(&outbox).values().all(|&w| !w));
    settle(&mut r, outbox, t0);
    assert!(held(&r, t0).is_empty());
}

/// The default, `hbm_sharing = "auto"`, on 600 MiB.
fn auto() -> Registry {
    Registry::new(Config::parse("[[gpu]]\nindex = 0\nhbm = \"600MiB\"\n", "test").unwrap(), Instant::now(), 0)
}

#[test]
fn by_default_programs_of_different_jobs_take_turns_and_fair_share_returns_with_an_engine() {
    let mut r = auto();
    let t0 = Instant::now();
    let (a, mut outbox) = program_of_job(&mut r, 1, 360, Some(100), t0);
    let (b, sent) = program_of_job(&mut r, 2, 360, Some(200), t0);
    outbox.extend(sent);
    let settled = settle(&mut r, outbox, t0);
    assert_eq!((settled[&a], settled[&b]), (560 * MIB, 40 * MIB), "A has its turn, B keeps room for two acquires");
    assert_eq!((waiting(&r, t0), held(&r, t0)), (vec![b], vec![b]), "B waits for its turn, held");
    assert_eq!(r.take_sharing_changes(), vec![(0, true)]);
    assert!(r.status(0, None, t0).pools[0].in_turns, "status does not say the GPU is in turns");

    // An engine comes, which cannot be held: the GPU is shared fairly, B runs again.
    let (engine, outbox) = working(&mut r, 3, None, 250, t0);
    assert_eq!(waits(&outbox).get(&b), Some(&false), "B was not let go: {:?}", waits(&outbox));
    let settled = settle(&mut r, outbox, t0);
    assert_eq!((settled[&a], settled[&b], settled[&engine]), (200 * MIB, 200 * MIB, 200 * MIB));
    assert!(waiting(&r, t0).is_empty() && held(&r, t0).is_empty());
    assert_eq!(r.take_sharing_changes(), vec![(0, false)]);
    assert!(!r.status(0, None, t0).pools[0].in_turns);

    // It leaves: turns again.
    let outbox = r.disconnect(engine, t0);
    settle(&mut r, outbox, t0);
    assert_eq!(held(&r, t0).len(), 1, "neither program waits for its turn");
    assert_eq!(r.take_sharing_changes(), vec![(0, true)]);
}

#[test]
fn by_default_processes_of_one_job_share_fairly() {
    let mut r = auto();
    let t0 = Instant::now();
    let (a, mut outbox) = program_of_job(&mut r, 1, 360, Some(100), t0);
    let (b, sent) = program_of_job(&mut r, 1, 360, Some(100), t0);
    outbox.extend(sent);
    assert!(waits(&outbox).values().all(|&w| !w));
    assert!(r.status(0, None, t0).tenants.iter().all(|t| t.job == Some(100)), "status shows the job");
    let settled = settle(&mut r, outbox, t0);
    assert_eq!((settled[&a], settled[&b]), (300 * MIB, 300 * MIB));
    assert!(held(&r, t0).is_empty());
    // Programs run without `tiermem run` (no job) are each a job of their own.
    let mut r = auto();
    let (_, mut outbox) = program(&mut r, 1, 360, t0);
    let (_, sent) = program(&mut r, 2, 360, t0);
    outbox.extend(sent);
    settle(&mut r, outbox, t0);
    assert_eq!(held(&r, t0).len(), 1);
}

#[test]
fn programs_larger_than_the_gpu_take_it_in_turns_when_the_others_can_wait() {
    let t0 = Instant::now();
    let mut r = Registry::new(config(""), t0, 0);
    let (a, mut outbox) = program(&mut r, 1, 800, t0);
    let (b, sent) = program(&mut r, 2, 700, t0);
    outbox.extend(sent);
    let settled = settle(&mut r, outbox, t0);
    // Neither fits the 600 MiB; both can wait: A (the older) has all B's keep leaves, B is held.
    assert_eq!((settled[&a], settled[&b]), (560 * MIB, 40 * MIB));
    assert_eq!((waiting(&r, t0), held(&r, t0)), (vec![b], vec![b]));
    // A's turn runs out: B has the GPU beyond its fit, A is held.
    let t1 = t0 + Duration::from_millis(1000);
    acquiring(&mut r, a, 2, t1);
    let (_, outbox) = r.expire_deadlines(t1);
    let settled = settle(&mut r, outbox, t1);
    assert_eq!((settled[&a], settled[&b]), (40 * MIB, 560 * MIB));
    assert_eq!((waiting(&r, t1), held(&r, t1)), (vec![a], vec![a]));

    // Beside an engine, which cannot wait, nobody runs beyond its fit: fair share, nobody held.
    let mut r = Registry::new(config(""), t0, 0);
    let (a, mut outbox) = program(&mut r, 1, 800, t0);
    let (engine, sent) = working(&mut r, 2, None, 700, t0);
    outbox.extend(sent);
    let settled = settle(&mut r, outbox, t0);
    assert_eq!((settled[&a], settled[&engine]), (300 * MIB, 300 * MIB));
    assert!(waiting(&r, t0).is_empty() && held(&r, t0).is_empty());
}

#[test]
fn a_program_in_the_second_half_of_a_turn_that_runs_out_is_told_that_others_wait_for_it() {
    let t0 = Instant::now();
    let mut r = Registry::new(config(""), t0, 0);
    let (a, mut outbox) = program(&mut r, 1, 500, t0);
    let (b, sent) = program(&mut r, 2, 500, t0);
    outbox.extend(sent);
    // Met cut by cut, the last word each tenant was sent stands: A has its turn (1 s) while B
    // waits, but in its first half A is told nothing.
    let mut told = BTreeMap::new();
    settle_seeing(&mut r, outbox, t0, |outbox| told.extend(others_wait(outbox)));
    assert!(told.values().all(|&w| !w), "told in the first half of a turn: {told:?}");
    // `tiermem status` shows what is left of A's turn; B has none.
    let left = |r: &Registry, id: TenantId, now: Instant| {
        r.status(0, None, now).tenants.iter().find(|t| t.tenant == id).and_then(|t| t.turn_left_ms)
    };
    assert_eq!((left(&r, a, t0), left(&r, b, t0)), (Some(1000), None));
    assert_eq!(left(&r, a, t0 + Duration::from_millis(300)), Some(700));
    // Half the turn run: A is to make ready (the daemon's tick says it, nothing else changing).
    let half = t0 + Duration::from_millis(500);
    let (_, outbox) = r.expire_deadlines(half);
    assert_eq!(others_wait(&outbox), BTreeMap::from([(a, true)]), "A has run half its turn while B waits");
    settle(&mut r, outbox, half);
    assert!(r.expire_deadlines(half + Duration::from_millis(100)).1.is_empty(), "said once");

    // A's turn runs out: B's begins, A is no longer told; half of B's turn later, B is.
    let t1 = t0 + Duration::from_millis(1000);
    acquiring(&mut r, a, 2, t1);
    let (_, outbox) = r.expire_deadlines(t1);
    let mut told = others_wait(&outbox);
    let cut = budgets(&outbox).into_iter().find(|&(id, ..)| id == a).expect("A's cut");
    let met = r.budget_met(a, cut.1, t1);
    settle_seeing(&mut r, met, t1, |outbox| told.extend(others_wait(outbox)));
    assert_eq!((told[&a], told.get(&b)), (false, Some(&false)), "{told:?}");
    let (_, outbox) = r.expire_deadlines(t1 + Duration::from_millis(500));
    assert_eq!(others_wait(&outbox), BTreeMap::from([(b, true)]));
    assert_eq!((left(&r, a, t1), left(&r, b, t1 + Duration::from_millis(600))), (None, Some(400)));

    // B alone: nobody waits for it any more, and its turn does not run out.
    let outbox = r.disconnect(a, t1 + Duration::from_millis(500));
    assert_eq!(others_wait(&outbox).get(&b), Some(&false));
    assert_eq!(left(&r, b, t1 + Duration::from_millis(600)), None);

    // Turns that never run out (turn_ms = 0): nothing to make ready for.
    let endless = "hbm_sharing = \"working-sets\"\nturn_ms = 0\n[[gpu]]\nindex = 0\nhbm = \"600MiB\"\n";
    let mut r = Registry::new(Config::parse(endless, "test").unwrap(), t0, 0);
    let (_, mut outbox) = program(&mut r, 1, 500, t0);
    outbox.extend(program(&mut r, 2, 500, t0).1);
    let mut told = others_wait(&outbox);
    settle_seeing(&mut r, outbox, t0, |outbox| told.extend(others_wait(outbox)));
    let (_, outbox) = r.expire_deadlines(t0 + Duration::from_secs(3600));
    told.extend(others_wait(&outbox));
    assert!(told.values().all(|&w| !w), "{told:?}");
}

#[test]
fn a_newcomer_waits_while_the_first_sets_up_and_runs_beside_it_once_it_has() {
    // Admitted beside a program still growing, on memory it does not use yet, a newcomer would
    // be cut as the first grows, and the first held while it gave that memory back.
    let t0 = Instant::now();
    let mut r = Registry::new(config("ramp_ms = 3000"), t0, 0);
    let (a, outbox) = program(&mut r, 1, 100, t0);
    settle(&mut r, outbox, t0);
    let t1 = t0 + Duration::from_millis(100);
    let (b, outbox) = program(&mut r, 2, 100, t1);
    settle(&mut r, outbox, t1);
    assert_eq!((waiting(&r, t1), held(&r, t1)), (vec![b], vec![b]), "B ran beside A setting up");
    // A grows to 360 MiB (which would still fit beside B's 100), then holds still.
    let t2 = t0 + Duration::from_millis(500);
    acquiring(&mut r, a, 2, t2);
    let outbox = r.usage(a, demand(360 * MIB), t2);
    settle(&mut r, outbox, t2);
    assert_eq!(waiting(&r, t2), vec![b]);
    // `ramp_ms` after its last growth A has set up: at its next report B runs beside it.
    let t3 = t2 + Duration::from_millis(3000);
    acquiring(&mut r, a, 3, t3);
    let outbox = r.usage(a, demand(360 * MIB), t3);
    let budgets = settle(&mut r, outbox, t3);
    assert!(waiting(&r, t3).is_empty() && held(&r, t3).is_empty(), "B still waits: {budgets:?}");
    assert!(budgets[&b] >= 100 * MIB, "{budgets:?}");
}

#[test]
fn a_program_that_grows_past_the_gpu_in_its_turn_keeps_it_unless_the_other_cannot_wait() {
    // Both fit, then A grows past the GPU within its turn. A later program that happens to fit
    // does not take the turn over: A runs beyond its fit, B waits, held. An engine, which
    // cannot wait, runs whole instead, and A waits.
    for b_is_a_program in [true, false] {
        let t0 = Instant::now();
        let mut r = Registry::new(config(""), t0, 0);
        let (a, mut outbox) = program(&mut r, 1, 400, t0);
        let (b, sent) = match b_is_a_program {
            true => program(&mut r, 2, 100, t0),
            false => working(&mut r, 2, None, 100, t0),
        };
        outbox.extend(sent);
        settle(&mut r, outbox, t0);
        assert!(waiting(&r, t0).is_empty(), "both fit");
        let t1 = t0 + Duration::from_millis(200);
        acquiring(&mut r, a, 2, t1);
        let outbox = r.usage(a, demand(700 * MIB), t1);
        let budgets = settle(&mut r, outbox, t1);
        match b_is_a_program {
            true => {
                assert_eq!((waiting(&r, t1), held(&r, t1)), (vec![b], vec![b]), "B took A's turn over");
                assert_eq!(budgets[&a], 560 * MIB, "A has all but B's keep");
            }
            false => assert_eq!(waiting(&r, t1), vec![a], "the engine was kept waiting"),
        }
    }
}

/// Tenant `id`'s HBM budget as `status` shows it.
fn budget_of(r: &Registry, id: TenantId, now: Instant) -> u64 {
    let shares = r.status(0, None, now).pools.into_iter().flat_map(|p| p.shares);
    shares.filter(|s| s.tenant == id).map(|s| s.budget).next().expect("a share")
}

#[test]
fn a_program_yet_to_work_takes_nothing_from_one_setting_up_and_is_admitted_when_it_fits() {
    let t0 = Instant::now();
    let mut r = Registry::new(config(""), t0, 0);
    let (a, outbox) = program(&mut r, 1, 100, t0);
    settle(&mut r, outbox, t0);
    // B registers: until it reports a demand, what A does not use yet stays A's (A is still
    // allocating; spread to B, A's budget would trail its allocations).
    let joining = Joining { gpu: gpu(), chunk_bytes: CHUNK, wants: &[], held: &[], waits: true, job: None };
    let (b, _, outbox) = r.register(who(2, None), joining, t0);
    settle(&mut r, outbox, t0);
    assert_eq!((budget_of(&r, a, t0), budget_of(&r, b, t0)), (600 * MIB, 0));
    // B works, and fits beside A: admitted at its first report.
    acquiring(&mut r, b, 1, t0);
    let outbox = r.usage(b, demand(100 * MIB), t0);
    settle(&mut r, outbox, t0);
    assert!(budget_of(&r, b, t0) >= 100 * MIB && waiting(&r, t0).is_empty());
}

#[test]
fn a_newcomer_held_while_room_is_made_beside_the_incumbent_does_not_take_its_turn() {
    let t0 = Instant::now();
    let mut r = Registry::new(config("ramp_ms = 3000"), t0, 0);
    let (a, outbox) = program(&mut r, 1, 500, t0);
    settle(&mut r, outbox, t0);
    let t1 = t0 + Duration::from_secs(5);
    acquiring(&mut r, a, 2, t1);
    let outbox = r.usage(a, demand(500 * MIB), t1);
    settle(&mut r, outbox, t1);
    // B fits beside A, but A holds all 600 MiB until it meets its cut: B is held meanwhile.
    let (b, _) = program(&mut r, 2, 100, t1);
    assert_eq!(held(&r, t1), vec![b]);
    // A's next report, its cut not met yet: A keeps its turn (B, still ramping up, does not
    // go first for a turn that began while A's restarted, uncontended, at every report).
    let t2 = t1 + Duration::from_millis(100);
    acquiring(&mut r, a, 3, t2);
    r.usage(a, demand(500 * MIB), t2);
    assert!(waiting(&r, t2).is_empty(), "A lost its turn to B");
}

#[test]
fn by_default_a_job_with_tenants_on_two_gpus_shares_each_fairly() {
    // Its processes wait on each other across GPUs (NCCL), and one GPU's turns need not line up
    // with another's: held here while it has the turn there, a job would stall.
    let mut r = auto();
    let t0 = Instant::now();
    let mut outbox = Vec::new();
    let mut tenant = |r: &mut Registry, uid: u32, index: u32, job: u32| {
        let gpu = tiermem_protocol::GpuId { index, ..gpu() };
        let joining = Joining { gpu, chunk_bytes: CHUNK, wants: &[], held: &[], waits: true, job: Some(job) };
        let (id, _, sent) = r.register(who(uid, None), joining, t0);
        outbox.extend(sent);
        acquiring(r, id, 1, t0);
        outbox.extend(r.usage(id, demand(360 * MIB), t0));
        id
    };
    // Job 200's rank on GPU 1 registers first, alone there for a moment.
    let other_gpu = tenant(&mut r, 3, 1, 200);
    tenant(&mut r, 2, 0, 200);
    tenant(&mut r, 1, 0, 100);
    settle(&mut r, outbox, t0);
    let in_turns = |r: &Registry| r.status(0, None, t0).pools.iter().filter(|p| p.in_turns).count();
    assert_eq!(in_turns(&r), 0, "a GPU of a job spanning two is in turns");
    assert!(held(&r, t0).is_empty());
    // The log says how a GPU is shared once two tenants share it, not of a tenant alone.
    assert_eq!(r.take_sharing_changes(), vec![(0, false)]);
    // Job 200 leaves GPU 1: GPU 0's two programs, each of a job of its own, take turns.
    let outbox = r.disconnect(other_gpu, t0);
    settle(&mut r, outbox, t0);
    assert_eq!((in_turns(&r), held(&r, t0).len()), (1, 1));
    assert_eq!(r.take_sharing_changes(), vec![(0, true)]);
}
