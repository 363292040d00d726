//! Priority (GPrioSwap §4.2): lowest priority first, seeded random among equals.

use tiermem_policy::{new_policy, Candidate, PolicyKind};

fn with_priorities(priorities: &[i32]) -> Vec<Candidate> {
    priorities
        .iter()
        .enumerate()
        .map(|(i, &priority)| Candidate {
            key: i as u64,
            last_use: 1_000 - i as u64,
            clean: false,
            priority,
            next_use: None,
            kept: false,
        })
        .collect()
}

#[test]
fn lowest_priority_goes_first() {
    let candidates = with_priorities(&[5, -3, 9, 0, 7]);
    let mut policy = new_policy(PolicyKind::Priority, 1);
    assert_eq!(policy.select_victims(&candidates, 3), vec![1, 3, 0]);
    assert_eq!(policy.select_victims(&candidates, 5), vec![1, 3, 0, 4, 2]);
}

#[test]
fn ignores_recency_and_cleanliness() {
    let mut candidates = with_priorities(&[1, 2]);
    candidates[0].last_use = u64::MAX;
    candidates[1].last_use = 0;
    candidates[1].clean = true;
    assert_eq!(new_policy(PolicyKind::Priority, 0).select_victims(&candidates, 1), vec![0]);
}

#[test]
fn choice_among_equals_depends_on_the_seed_only() {
    // Eight low-priority chunks compete for three slots; the high-priority one never loses.
    let mut priorities = vec![0; 8];
    priorities.push(10);
    let candidates = with_priorities(&priorities);
    let picks = |seed: u64| {
        let mut policy = new_policy(PolicyKind::Priority, seed);
        (0..5).map(|_| policy.select_victims(&candidates, 3)).collect::<Vec<_>>()
    };
    for seed in 0..20 {
        let run = picks(seed);
        assert_eq!(run, picks(seed), "seed {seed} is not reproducible");
        assert!(run.iter().flatten().all(|&i| i < 8), "high priority evicted: {run:?}");
    }
    let distinct: std::collections::HashSet<_> = (0..20).map(|seed| picks(seed)[0].clone()).collect();
    assert!(distinct.len() > 10, "seed barely matters: {distinct:?}");
}

#[test]
fn successive_calls_continue_the_stream() {
    let candidates = with_priorities(&[0; 16]);
    let mut policy = new_policy(PolicyKind::Priority, 42);
    let calls: Vec<_> = (0..8).map(|_| policy.select_victims(&candidates, 4)).collect();
    assert!(calls.windows(2).any(|pair| pair[0] != pair[1]), "every call repeats: {calls:?}");
}

#[test]
fn ties_are_spread_over_every_equal_candidate() {
    let candidates = with_priorities(&[3, 3, 3, 3, 3, 3, 9]);
    let mut policy = new_policy(PolicyKind::Priority, 5);
    let mut hits = [0usize; 7];
    for _ in 0..600 {
        hits[policy.select_victims(&candidates, 1)[0]] += 1;
    }
    assert_eq!(hits[6], 0);
    assert!(hits[..6].iter().all(|&h| (50..=150).contains(&h)), "skewed: {hits:?}");
}
