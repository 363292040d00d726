//! Uniform random victims: the worst-case baseline.

use rand::SeedableRng;
use rand_pcg::Pcg64Mcg;

use crate::{Candidate, EvictionPolicy, PolicyKind};

/// Evicts candidates chosen uniformly at random, without replacement.
pub(crate) struct Random {
    rng: Pcg64Mcg,
}

impl Random {
    /// Seeds the policy's random stream.
    pub(crate) fn new(seed: u64) -> Self {
        Self { rng: Pcg64Mcg::seed_from_u64(seed) }
    }
}

impl EvictionPolicy for Random {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Random
    }

    fn select_victims(&mut self, candidates: &[Candidate], count: usize) -> Vec<usize> {
        let len = candidates.len();
        rand::seq::index::sample(&mut self.rng, len, count.min(len)).into_vec()
    }
}
