//! LRU-COST (GDM §4.4): clean chunks first, within the bottom of the LRU stack.

use crate::lru::oldest;
use crate::{Candidate, EvictionPolicy, PolicyKind, LRU_COST_SELECTION_FACTOR};

/// Re-sorts the least recently used window by eviction cost (clean before dirty).
pub(crate) struct LruCost;

impl EvictionPolicy for LruCost {
    fn kind(&self) -> PolicyKind {
        PolicyKind::LruCost
    }

    fn select_victims(&mut self, candidates: &[Candidate], count: usize) -> Vec<usize> {
        let len = candidates.len();
        let share = (LRU_COST_SELECTION_FACTOR * len as f64).ceil() as usize;
        let mut window = oldest(candidates, count.max(share).min(len));
        // Stable: equal cost keeps LRU order. `false < true`, so clean chunks come first.
        window.sort_by_key(|&i| !candidates[i].clean);
        window.truncate(count);
        window
    }
}
