//! Priority (GPrioSwap §4.2): lowest priority first, seeded random among equals.

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

use crate::{smallest_by_key, Candidate, EvictionPolicy, PolicyKind};

/// Evicts the lowest `priority` first; equal priorities are ordered at random.
pub(crate) struct Priority {
    rng: Pcg64Mcg,
}

impl Priority {
    /// Seeds the policy's random stream.
    pub(crate) fn new(seed: u64) -> Self {
        Self { rng: Pcg64Mcg::seed_from_u64(seed) }
    }
}

impl EvictionPolicy for Priority {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Priority
    }

    fn select_victims(&mut self, candidates: &[Candidate], count: usize) -> Vec<usize> {
        // A fresh random tag per candidate makes the order within each priority class a
        // uniform random permutation; the index only settles (vanishingly rare) tag collisions.
        let tags: Vec<u64> = (0..candidates.len()).map(|_| self.rng.random()).collect();
        smallest_by_key(candidates.len(), count, |i| (candidates[i].priority, tags[i], i))
    }
}
