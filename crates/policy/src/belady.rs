//! Belady: the chunk whose next use is furthest away goes first.

use crate::{smallest_by_key, Candidate, EvictionPolicy, PolicyKind};
use std::cmp::Reverse;

/// Evicts chunks with no known next use first (oldest first), then the furthest next use
/// first; equal next uses go oldest first, then by index. Chunks of the planned resident set
/// (`Candidate::kept`) go after all others, in the same order among themselves.
pub(crate) struct Belady;

impl EvictionPolicy for Belady {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Belady
    }

    fn select_victims(&mut self, candidates: &[Candidate], count: usize) -> Vec<usize> {
        smallest_by_key(candidates.len(), count, |i| {
            let c = &candidates[i];
            // `None` sorts before every `Some(Reverse(_))`: no known use goes first; the
            // planned resident set last.
            (c.kept, c.next_use.map(Reverse), c.last_use, i)
        })
    }
}
