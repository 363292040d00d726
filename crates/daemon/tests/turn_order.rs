//! Who has the GPU next when programs under `tiermem run` take turns (registry/turns.rs): the
//! one whose turn it is runs even when it does not fit beside a later one that does, and a
//! newcomer's service counts from the least of the others', so that it is not owed as many
//! turns as they have had.

mod registry_support;

use registry_support::*;
use std::time::{Duration, Instant};
use tiermem_daemon::config::Config;
use tiermem_daemon::registry::{Registry, TenantId};

/// The default sharing (`auto`) on 600 MiB, turns of 1 s, tenants set up at once.
fn registry(t0: Instant) -> Registry {
    let text = "turn_ms = 1000\nramp_ms = 0\nidle_after_ms = 0\n[[gpu]]\nindex = 0\nhbm = \"600MiB\"\n";
    Registry::new(Config::parse(text, "test").unwrap(), t0, 0)
}

/// Every 400 ms from `from` for `steps` steps, `working` (tenant, MiB) report as they work on and
/// meet their cuts: which of `names` has the GPU (the one not held) at each step.
fn who_has_it(
    r: &mut Registry,
    working: &[(TenantId, u64)],
    names: &[(TenantId, &'static str)],
    from: Instant,
    steps: u32,
) -> Vec<&'static str> {
    (1..=steps)
        .map(|k| {
            let t = from + Duration::from_millis(400 * u64::from(k));
            let mut outbox = r.expire_deadlines(t).1;
            for &(id, mib) in working {
                acquiring(r, id, u64::from(k) + 1, t);
                outbox.extend(r.usage(id, demand(mib * MIB), t));
            }
            settle(r, outbox, t);
            let held = held(r, t);
            let running: Vec<_> = names.iter().filter(|(id, _)| !held.contains(id)).map(|&(_, n)| n).collect();
            match running[..] {
                [one] => one,
                _ => panic!("not one running: {running:?}"),
            }
        })
        .collect()
}

#[test]
fn a_program_larger_than_the_gpu_is_not_passed_over_for_one_that_fits() {
    // Passed over for B, which fits, A (larger than the GPU) waited, held, as long as B worked.
    let t0 = Instant::now();
    let mut r = registry(t0);
    let (a, outbox) = program(&mut r, 1, 800, t0);
    settle(&mut r, outbox, t0);
    let (b, outbox) = program(&mut r, 2, 100, t0);
    settle(&mut r, outbox, t0);
    // Turns of 1 s: A's (the older) beyond its fit, B's, A's again.
    let had_it = who_has_it(&mut r, &[(a, 800), (b, 100)], &[(a, "A"), (b, "B")], t0, 6);
    assert_eq!(had_it, ["A", "A", "B", "B", "B", "A"]);
}

#[test]
fn a_newcomer_is_not_owed_the_turns_the_others_have_had() {
    // A and B take turns for 8 s; C comes. Its service counted from zero, C took turn after
    // turn until it had been served as long as they had (4 s), A and B held meanwhile.
    let t0 = Instant::now();
    let mut r = registry(t0);
    let (a, mut outbox) = program(&mut r, 1, 500, t0);
    let (b, sent) = program(&mut r, 2, 500, t0);
    outbox.extend(sent);
    settle(&mut r, outbox, t0);
    let both = [(a, 500), (b, 500)];
    let had_it = who_has_it(&mut r, &both, &[(a, "A"), (b, "B")], t0, 20);
    assert!(had_it.contains(&"A") && had_it.contains(&"B"), "{had_it:?}");
    let t1 = t0 + Duration::from_millis(8000);
    let (c, outbox) = program(&mut r, 3, 500, t1);
    settle(&mut r, outbox, t1);
    let all = [(a, 500), (b, 500), (c, 500)];
    let had_it = who_has_it(&mut r, &all, &[(a, "A"), (b, "B"), (c, "C")], t1, 15);
    // Within 6 s each has had the GPU, C for no more than a turn at a time (1 s: three steps).
    let longest_c = had_it.split(|&n| n != "C").map(<[_]>::len).max().unwrap_or(0);
    assert!(had_it.contains(&"A") && had_it.contains(&"B") && (1..=3).contains(&longest_c), "{had_it:?}");
}
