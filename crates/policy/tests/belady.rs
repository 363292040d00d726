//! Belady: furthest next use first, unknown next use before all, LRU among equals.

use tiermem_policy::{new_policy, Candidate, PolicyKind};

fn with_next_uses(next_uses: &[Option<u64>]) -> Vec<Candidate> {
    next_uses
        .iter()
        .enumerate()
        .map(|(i, &next_use)| Candidate {
            key: i as u64,
            last_use: 100 - i as u64,
            clean: true,
            priority: 0,
            next_use,
            kept: false,
        })
        .collect()
}

#[test]
fn furthest_next_use_goes_first() {
    let candidates = with_next_uses(&[Some(3), Some(40), Some(7), Some(12)]);
    let victims = new_policy(PolicyKind::Belady, 0).select_victims(&candidates, 4);
    assert_eq!(victims, vec![1, 3, 2, 0]);
}

#[test]
fn chunks_never_used_again_go_before_any_scheduled_chunk_oldest_first() {
    // Indices 1 and 3 have no next use; 3 is older (smaller last_use).
    let candidates = with_next_uses(&[Some(90), None, Some(5), None]);
    let victims = new_policy(PolicyKind::Belady, 0).select_victims(&candidates, 3);
    assert_eq!(victims, vec![3, 1, 0]);
}

#[test]
fn the_planned_resident_set_goes_last_whatever_its_next_use() {
    let mut candidates = with_next_uses(&[Some(90), Some(5), None, Some(40)]);
    candidates[0].kept = true;
    candidates[2].kept = true;
    let victims = new_policy(PolicyKind::Belady, 0).select_victims(&candidates, 4);
    assert_eq!(victims, vec![3, 1, 2, 0]);
}

#[test]
fn equal_next_uses_go_least_recently_used_first() {
    let mut candidates = with_next_uses(&[Some(8), Some(8), Some(8)]);
    candidates[0].last_use = 50;
    candidates[1].last_use = 10;
    candidates[2].last_use = 30;
    let victims = new_policy(PolicyKind::Belady, 0).select_victims(&candidates, 2);
    assert_eq!(victims, vec![1, 2]);
}

#[test]
fn without_a_schedule_belady_is_lru() {
    let candidates = with_next_uses(&[None; 6]);
    let belady = new_policy(PolicyKind::Belady, 0).select_victims(&candidates, 4);
    let lru = new_policy(PolicyKind::Lru, 0).select_victims(&candidates, 4);
    assert_eq!(belady, lru);
}

/// On a cyclic schedule of `n` chunks through `cap` slots, Belady misses `n - cap + 1` times per
/// pass once warm (everything but `cap - 1` chunks streams); LRU misses all `n`.
#[test]
fn cyclic_loop_larger_than_capacity_streams_only_the_excess() {
    let (n, cap, passes) = (10u64, 4usize, 5u64);
    for (kind, expected_misses_per_pass) in [(PolicyKind::Belady, n - cap as u64 + 1), (PolicyKind::Lru, n)] {
        let mut policy = new_policy(kind, 0);
        let mut resident: Vec<(u64, u64)> = Vec::new(); // (chunk, last_use)
        let mut misses_last_pass = 0;
        for t in 0..n * passes {
            let (chunk, position) = (t % n, t % n);
            if t % n == 0 {
                misses_last_pass = 0;
            }
            if let Some(entry) = resident.iter_mut().find(|(c, _)| *c == chunk) {
                entry.1 = t;
                continue;
            }
            misses_last_pass += 1;
            if resident.len() == cap {
                let candidates: Vec<Candidate> = resident
                    .iter()
                    .enumerate()
                    .map(|(i, &(c, last_use))| Candidate {
                        key: i as u64,
                        last_use,
                        clean: true,
                        priority: 0,
                        next_use: Some((c + n - position) % n),
                        kept: false,
                    })
                    .collect();
                let victim = policy.select_victims(&candidates, 1)[0];
                resident.swap_remove(victim);
            }
            resident.push((chunk, t));
        }
        assert_eq!(misses_last_pass, expected_misses_per_pass, "{kind}");
    }
}
