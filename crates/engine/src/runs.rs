//! The one coalescer: runs of consecutive items that can travel as one transfer.
//!
//! Every transfer path cuts its chunks into runs — batches of consecutive chunks of one buffer
//! (mapped together, one `cuMemSetAccess`), copies whose host slots are adjacent (one copy
//! each), reads from staging into consecutive addresses (file_reads.rs) — and they all ask the
//! same question: does this item continue the run that started `k` items earlier?

use crate::state::ChunkRef;
use tiermem_mechanism::{DevicePtr, HostPtr};

/// Cuts `items` into maximal runs of at most `max` items, each item `k` places after its run's
/// first `continues(first, k, item)`. Returns `(start, len)` of each run, in order.
pub(crate) fn runs<T>(items: &[T], max: usize, continues: impl Fn(&T, usize, &T) -> bool) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        if let Some((start, len)) = out.last_mut() {
            if *len < max && continues(&items[*start], *len, item) {
                *len += 1;
                continue;
            }
        }
        out.push((i, 1));
    }
    out
}

/// Splits sorted chunk refs into batches of at most `max` consecutive chunks of one buffer.
pub(crate) fn batches(refs: &[ChunkRef], max: usize) -> impl Iterator<Item = &[ChunkRef]> {
    let consecutive = |first: &ChunkRef, k: usize, r: &ChunkRef| r.0 == first.0 && r.1 == first.1 + k;
    runs(refs, max.max(1), consecutive).into_iter().map(move |(start, len)| &refs[start..start + len])
}

/// Where a chunk coming up gets its bytes, or where a chunk going down puts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// A pinned host slot at this address, in this slab (pinned allocation) of the host tier.
    Host(HostPtr, usize),
    /// A slot of HBM lent by a neighbour, at this device address, in this slab of the peer tier.
    Peer(DevicePtr, usize),
    /// Never written: zeros.
    Zeros,
    /// The file: the background reader copies it (file_reads.rs).
    File,
}

/// Groups consecutive chunks into single transfers: runs of host (or peer) slots at adjacent
/// addresses (`chunk` bytes apart) within one slab, runs of zero-fills, runs read from the file. Yields
/// `(first, count, source of the first)`.
pub(crate) fn coalesce(sources: &[Source], chunk: usize) -> Vec<(usize, usize, Source)> {
    let continues = |first: &Source, k: usize, source: &Source| match (*first, *source) {
        (Source::Host(s, slab), Source::Host(a, other)) => slab == other && a == s + k * chunk,
        (Source::Peer(s, slab), Source::Peer(a, other)) => slab == other && a == s + (k * chunk) as u64,
        (Source::Host(..) | Source::Peer(..), _) | (_, Source::Host(..) | Source::Peer(..)) => false,
        (a, b) => a == b,
    };
    runs(sources, usize::MAX, continues).into_iter().map(|(start, len)| (start, len, sources[start])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BufferId;

    #[test]
    fn batches_split_at_buffer_gaps_and_size() {
        let (a, b) = (BufferId(1), BufferId(2));
        let refs = [(a, 0), (a, 1), (a, 2), (a, 4), (b, 0), (b, 1)];
        let got: Vec<&[ChunkRef]> = batches(&refs, 2).collect();
        assert_eq!(got, vec![&refs[0..2], &refs[2..3], &refs[3..4], &refs[4..6]]);
    }

    #[test]
    fn coalesce_joins_adjacent_slots_zero_runs_and_file_runs() {
        let g = 0x10;
        use Source::{File, Host, Zeros};
        let h = |addr| Host(addr, 0);
        let sources = [h(0x100), h(0x110), h(0x200), Zeros, Zeros, h(0x210), File, File, Zeros];
        assert_eq!(
            coalesce(&sources, g),
            vec![(0, 2, h(0x100)), (2, 1, h(0x200)), (3, 2, Zeros), (5, 1, h(0x210)), (6, 2, File), (8, 1, Zeros)]
        );
    }

    /// Two pinned slabs the driver placed back to back are still two allocations: one copy
    /// spanning both fails on the GPU (the tenants benchmark saw `CUDA_ERROR_INVALID_VALUE`).
    #[test]
    fn coalesce_never_joins_slots_of_two_slabs() {
        let g = 0x10;
        let sources = [Source::Host(0x1f0, 0), Source::Host(0x200, 1), Source::Host(0x210, 1)];
        assert_eq!(coalesce(&sources, g), vec![(0, 1, Source::Host(0x1f0, 0)), (1, 2, Source::Host(0x200, 1))]);
    }

    #[test]
    fn runs_continue_on_both_sides_at_once() {
        let g = 4;
        let pairs = [(0u64, 100usize), (4, 104), (8, 200), (12, 204), (20, 208)];
        let both = |f: &(u64, usize), k: usize, p: &(u64, usize)| p.0 == f.0 + (k * g) as u64 && p.1 == f.1 + k * g;
        assert_eq!(runs(&pairs, 8, both), vec![(0, 2), (2, 2), (4, 1)]);
    }
}
