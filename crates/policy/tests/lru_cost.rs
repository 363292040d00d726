//! LRU-COST (GDM §4.4): clean before dirty, but only within the bottom 20% of the LRU stack.

use tiermem_policy::{new_policy, Candidate, PolicyKind};

/// Candidate `i` has `last_use = i` (index 0 is the oldest); `clean[i]` sets its cost.
fn by_age(clean: &[bool]) -> Vec<Candidate> {
    clean
        .iter()
        .enumerate()
        .map(|(i, &clean)| Candidate {
            key: 100 + i as u64,
            last_use: i as u64,
            clean,
            priority: 0,
            next_use: None,
            kept: false,
        })
        .collect()
}

fn select(candidates: &[Candidate], count: usize) -> Vec<usize> {
    new_policy(PolicyKind::LruCost, 0).select_victims(candidates, count)
}

#[test]
fn clean_chunks_in_the_window_go_before_dirty_ones() {
    // 10 candidates: window = max(count, ceil(0.2 * 10) = 2).
    let mut clean = [false; 10];
    clean[1] = true;
    let candidates = by_age(&clean);
    assert_eq!(select(&candidates, 1), vec![1]);
    assert_eq!(select(&candidates, 2), vec![1, 0]);
}

#[test]
fn never_reaches_above_the_window() {
    // 10 candidates, window of 2: the clean chunk at age 2 is too recent to be considered.
    let mut clean = [false; 10];
    clean[2] = true;
    clean[9] = true;
    let candidates = by_age(&clean);
    assert_eq!(select(&candidates, 1), vec![0]);
    assert_eq!(select(&candidates, 2), vec![0, 1]);
}

#[test]
fn window_grows_to_the_request() {
    // count = 3 > ceil(0.2 * 10): the window is the 3 oldest, clean one first.
    let mut clean = [false; 10];
    clean[2] = true;
    clean[3] = true;
    assert_eq!(select(&by_age(&clean), 3), vec![2, 0, 1]);
}

#[test]
fn window_is_twenty_percent_rounded_up() {
    // 11 candidates: ceil(2.2) = 3, so the clean chunk at age 2 is inside, age 3 is not.
    let mut clean = [false; 11];
    clean[2] = true;
    assert_eq!(select(&by_age(&clean), 1), vec![2]);
    let mut clean = [false; 11];
    clean[3] = true;
    assert_eq!(select(&by_age(&clean), 1), vec![0]);
}

#[test]
fn keeps_lru_order_within_equal_cost() {
    // 20 candidates, window of 4 holding clean ages {1, 3} and dirty ages {0, 2}, shuffled in
    // the slice so the result cannot come from slice order.
    let mut candidates = by_age(&[false, true, false, true, false, false, false, false, false, false]);
    candidates.extend(by_age(&[false; 10]).into_iter().map(|c| Candidate { last_use: c.last_use + 10, ..c }));
    candidates.reverse();
    let victims = select(&candidates, 4);
    let ages: Vec<u64> = victims.iter().map(|&i| candidates[i].last_use).collect();
    assert_eq!(ages, vec![1, 3, 0, 2]);
}

#[test]
fn ties_in_age_break_by_index() {
    // All of age 0 and dirty: pure index order, window of ceil(0.2 * 5) = 1.
    let candidates: Vec<Candidate> = by_age(&[false; 5]).into_iter().map(|c| Candidate { last_use: 0, ..c }).collect();
    assert_eq!(select(&candidates, 1), vec![0]);
    assert_eq!(select(&candidates, 3), vec![0, 1, 2]);
}

#[test]
fn clamps_to_available_and_handles_empty() {
    assert_eq!(select(&by_age(&[false, true]), 5), vec![1, 0]);
    assert_eq!(select(&by_age(&[true, true]), 0), Vec::<usize>::new());
    assert_eq!(select(&[], 2), Vec::<usize>::new());
}
