//! Random: uniform, seeded, the worst-case baseline.

use tiermem_policy::{new_policy, Candidate, PolicyKind};

fn uniform(n: usize) -> Vec<Candidate> {
    (0..n)
        .map(|i| Candidate {
            key: i as u64,
            last_use: i as u64,
            clean: false,
            priority: 0,
            next_use: None,
            kept: false,
        })
        .collect()
}

fn run(seed: u64, candidates: &[Candidate], calls: usize, count: usize) -> Vec<Vec<usize>> {
    let mut policy = new_policy(PolicyKind::Random, seed);
    (0..calls).map(|_| policy.select_victims(candidates, count)).collect()
}

#[test]
fn deterministic_per_seed() {
    let candidates = uniform(50);
    assert_eq!(run(9, &candidates, 10, 5), run(9, &candidates, 10, 5));
    assert_ne!(run(9, &candidates, 10, 5), run(10, &candidates, 10, 5));
}

#[test]
fn covers_every_candidate_over_many_calls() {
    let candidates = uniform(40);
    let mut hits = [0usize; 40];
    for victims in run(3, &candidates, 400, 2) {
        assert_eq!(victims.len(), 2);
        assert_ne!(victims[0], victims[1]);
        for i in victims {
            hits[i] += 1;
        }
    }
    // 800 picks over 40 candidates: 20 expected each.
    assert!(hits.iter().all(|&h| (5..=40).contains(&h)), "not uniform: {hits:?}");
}

#[test]
fn not_biased_towards_the_oldest() {
    let candidates = uniform(100);
    let firsts: Vec<usize> = run(11, &candidates, 200, 1).into_iter().map(|v| v[0]).collect();
    let old_half = firsts.iter().filter(|&&i| i < 50).count();
    assert!((60..=140).contains(&old_half), "{old_half} of 200 from the oldest half");
}
