//! Properties every policy must satisfy, plus the ordering guarantees of LRU and Priority.

use proptest::prelude::*;
use tiermem_policy::{new_policy, Candidate, PolicyKind};

fn candidates() -> impl Strategy<Value = Vec<Candidate>> {
    // Small value ranges so ties in `last_use` and `priority` are common.
    let next_use = prop::option::of(0u64..20);
    let candidate = (0u64..20, any::<bool>(), -3i32..3, next_use).prop_map(|(last_use, clean, priority, next_use)| {
        Candidate { key: 0, last_use, clean, priority, next_use, kept: false }
    });
    prop::collection::vec(candidate, 0..60).prop_map(|mut v| {
        for (i, c) in v.iter_mut().enumerate() {
            c.key = i as u64;
        }
        v
    })
}

fn kind() -> impl Strategy<Value = PolicyKind> {
    prop::sample::select(PolicyKind::ALL.to_vec())
}

/// Whether each index of `0..len` was chosen.
fn chosen(len: usize, victims: &[usize]) -> Vec<bool> {
    let mut chosen = vec![false; len];
    for &i in victims {
        chosen[i] = true;
    }
    chosen
}

proptest! {
    #[test]
    fn well_formed_and_reproducible(
        kind in kind(),
        seed in any::<u64>(),
        cands in candidates(),
        counts in prop::collection::vec(0usize..80, 1..4),
    ) {
        let mut a = new_policy(kind, seed);
        let mut b = new_policy(kind, seed);
        for count in counts {
            let victims = a.select_victims(&cands, count);
            prop_assert_eq!(victims.len(), count.min(cands.len()));
            prop_assert!(victims.iter().all(|&i| i < cands.len()));
            prop_assert_eq!(chosen(cands.len(), &victims).iter().filter(|&&c| c).count(), victims.len());
            prop_assert_eq!(&victims, &b.select_victims(&cands, count));
        }
    }

    #[test]
    fn lru_victims_are_never_newer_than_survivors(cands in candidates(), count in 0usize..80) {
        let victims = new_policy(PolicyKind::Lru, 0).select_victims(&cands, count);
        let chosen = chosen(cands.len(), &victims);
        let newest_victim = victims.iter().map(|&i| cands[i].last_use).max();
        let oldest_survivor = (0..cands.len()).filter(|&i| !chosen[i]).map(|i| cands[i].last_use).min();
        if let (Some(v), Some(s)) = (newest_victim, oldest_survivor) {
            prop_assert!(v <= s, "victim age {} newer than survivor age {}", v, s);
        }
        prop_assert!(victims.windows(2).all(|w| cands[w[0]].last_use <= cands[w[1]].last_use));
    }

    #[test]
    fn priority_victims_never_outrank_survivors(seed in any::<u64>(), cands in candidates(), count in 0usize..80) {
        let victims = new_policy(PolicyKind::Priority, seed).select_victims(&cands, count);
        let chosen = chosen(cands.len(), &victims);
        let top_victim = victims.iter().map(|&i| cands[i].priority).max();
        let bottom_survivor = (0..cands.len()).filter(|&i| !chosen[i]).map(|i| cands[i].priority).min();
        if let (Some(v), Some(s)) = (top_victim, bottom_survivor) {
            prop_assert!(v <= s, "victim priority {} above survivor priority {}", v, s);
        }
        prop_assert!(victims.windows(2).all(|w| cands[w[0]].priority <= cands[w[1]].priority));
    }

    #[test]
    fn lru_cost_stays_in_its_window_and_prefers_clean(cands in candidates(), count in 0usize..80) {
        let victims = new_policy(PolicyKind::LruCost, 0).select_victims(&cands, count);
        let window_len = count.max(cands.len().div_ceil(5)).min(cands.len());
        let window = new_policy(PolicyKind::Lru, 0).select_victims(&cands, window_len);
        prop_assert!(victims.iter().all(|i| window.contains(i)));
        // Within the window, no dirty victim while a clean chunk survives.
        let any_dirty_victim = victims.iter().any(|&i| !cands[i].clean);
        let clean_survivor = window.iter().any(|i| !victims.contains(i) && cands[*i].clean);
        prop_assert!(!(any_dirty_victim && clean_survivor));
    }
}
