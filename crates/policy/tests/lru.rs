//! LRU evicts the least recently used chunks, oldest first.

use tiermem_policy::{new_policy, Candidate, PolicyKind};

fn aged(last_uses: &[u64]) -> Vec<Candidate> {
    last_uses
        .iter()
        .enumerate()
        .map(|(i, &last_use)| Candidate {
            key: i as u64,
            last_use,
            clean: i % 2 == 0,
            priority: 0,
            next_use: None,
            kept: false,
        })
        .collect()
}

#[test]
fn picks_the_oldest_in_age_order() {
    let candidates = aged(&[50, 10, 40, 30, 20, 60]);
    let mut lru = new_policy(PolicyKind::Lru, 0);
    assert_eq!(lru.select_victims(&candidates, 3), vec![1, 4, 3]);
    assert_eq!(lru.select_victims(&candidates, 1), vec![1]);
    assert_eq!(lru.select_victims(&candidates, 6), vec![1, 4, 3, 2, 0, 5]);
}

#[test]
fn ignores_priority_and_cleanliness() {
    let mut candidates = aged(&[5, 1, 9]);
    candidates[1].priority = 100;
    candidates[1].clean = false;
    candidates[2].clean = true;
    assert_eq!(new_policy(PolicyKind::Lru, 0).select_victims(&candidates, 1), vec![1]);
}

#[test]
fn ties_break_by_index() {
    let candidates = aged(&[7, 3, 7, 3, 7]);
    let mut lru = new_policy(PolicyKind::Lru, 0);
    assert_eq!(lru.select_victims(&candidates, 3), vec![1, 3, 0]);
    assert_eq!(lru.select_victims(&candidates, 5), vec![1, 3, 0, 2, 4]);
}

#[test]
fn clamps_to_available_and_handles_empty() {
    let mut lru = new_policy(PolicyKind::Lru, 0);
    assert_eq!(lru.select_victims(&aged(&[2, 1]), 10), vec![1, 0]);
    assert_eq!(lru.select_victims(&aged(&[2, 1]), 0), Vec::<usize>::new());
    assert_eq!(lru.select_victims(&[], 3), Vec::<usize>::new());
}

#[test]
fn large_input_selects_exactly_the_oldest() {
    // 70,000 candidates with scrambled ages (a permutation of 0..n).
    let n = 70_000u64;
    let ages: Vec<u64> = (0..n).map(|i| (i * 48_271) % n).collect();
    let candidates = aged(&ages);
    let victims = new_policy(PolicyKind::Lru, 0).select_victims(&candidates, 1_000);
    let picked: Vec<u64> = victims.iter().map(|&i| candidates[i].last_use).collect();
    assert_eq!(picked, (0..1_000).collect::<Vec<u64>>());
}
