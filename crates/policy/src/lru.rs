//! Least recently used first.

use crate::{smallest_by_key, Candidate, EvictionPolicy, PolicyKind};

/// Evicts the oldest `last_use` first; ties go to the lower index.
pub(crate) struct Lru;

/// The `count` least recently used candidates, oldest first (ties by index).
pub(crate) fn oldest(candidates: &[Candidate], count: usize) -> Vec<usize> {
    smallest_by_key(candidates.len(), count, |i| (candidates[i].last_use, i))
}

impl EvictionPolicy for Lru {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Lru
    }

    fn select_victims(&mut self, candidates: &[Candidate], count: usize) -> Vec<usize> {
        oldest(candidates, count)
    }
}
