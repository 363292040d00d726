//! Reading in place: where an acquire reads a chunk that the peer tier holds.
//!
//! A chunk in a neighbour GPU's HBM can be read two ways. It can come into local HBM: a copy
//! over NVLink (~5 µs for 2 MiB on the H200 pair) into a free physical chunk, after which
//! kernels read it at HBM speed. Or it can be read *in place*: its address is mapped to its
//! peer slot (an unmap, a map and a `cuMemSetAccess`, ~100 µs of driver time, once) and
//! kernels read it over NVLink (~346 GB/s) with no copy and no HBM taken (memHarvester's
//! "remote access" of harvested memory).
//!
//! The rule, per acquire that allows it (`Access::InPlaceOk`, or a buffer made for it):
//! * a chunk already acquired in place by someone else stays there: it cannot move while
//!   acquired;
//! * a chunk already mapped in place stays there: it costs nothing more, while moving it costs
//!   the driver calls back and a copy;
//! * otherwise free HBM goes to the chunks that need it: first those that can only be read in
//!   HBM (coming from the host, the file, or never written), then peer chunks in order. A peer
//!   chunk for which no free HBM is left is read in place: bringing it in would evict a chunk
//!   someone will want again, the thrashing that reading in place exists to avoid.
//!
//! Without permission only the first rule applies. Pure and deterministic: the engine
//! describes each chunk and applies the answer.

/// A chunk of an acquire, as the in-place rule sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerRead {
    /// Not in the peer tier (or already in HBM): it is read in HBM.
    Elsewhere,
    /// In the peer tier, its address not mapped there.
    Unmapped,
    /// In the peer tier and mapped in place.
    Mapped,
    /// In the peer tier and acquired in place by another caller.
    Pinned,
}

/// For each chunk of an acquire (in order), whether it is read in place. `missing` counts the
/// chunks not in HBM that can only be read there (they take free HBM first); `free_hbm` is
/// the HBM that can be had without evicting; `allowed` says whether the caller accepts
/// reads in place.
pub fn read_in_place(chunks: &[PeerRead], missing: usize, free_hbm: usize, allowed: bool) -> Vec<bool> {
    let mut left = free_hbm.saturating_sub(missing);
    chunks
        .iter()
        .map(|&c| match c {
            PeerRead::Pinned => true,
            PeerRead::Elsewhere => false,
            _ if !allowed => false,
            PeerRead::Mapped => true,
            PeerRead::Unmapped if left > 0 => {
                left -= 1;
                false
            }
            PeerRead::Unmapped => true,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reads() -> impl Strategy<Value = Vec<PeerRead>> {
        prop::collection::vec(
            prop_oneof![
                Just(PeerRead::Elsewhere),
                Just(PeerRead::Unmapped),
                Just(PeerRead::Mapped),
                Just(PeerRead::Pinned)
            ],
            0..40,
        )
    }

    #[test]
    fn free_hbm_goes_to_what_only_hbm_can_serve_then_to_peer_chunks_in_order() {
        use PeerRead::*;
        let chunks = [Elsewhere, Unmapped, Unmapped, Mapped, Unmapped];
        assert_eq!(read_in_place(&chunks, 1, 3, true), [false, false, false, true, true]);
        assert_eq!(read_in_place(&chunks, 3, 3, true), [false, true, true, true, true]);
        assert_eq!(read_in_place(&chunks, 0, 0, false), [false; 5]);
        assert_eq!(read_in_place(&[Pinned, Mapped], 0, 9, false), [true, false]);
    }

    proptest! {
        #[test]
        fn the_rule_keeps_its_promises(chunks in reads(), missing in 0usize..20, free in 0usize..40, allowed: bool) {
            let answer = read_in_place(&chunks, missing, free, allowed);
            prop_assert_eq!(answer.len(), chunks.len());
            let mut brought = 0;
            for (&c, &in_place) in chunks.iter().zip(&answer) {
                match c {
                    PeerRead::Pinned => prop_assert!(in_place, "an acquired chunk cannot move"),
                    PeerRead::Elsewhere => prop_assert!(!in_place),
                    PeerRead::Mapped => prop_assert_eq!(in_place, allowed),
                    PeerRead::Unmapped => {
                        prop_assert!(allowed || !in_place);
                        brought += usize::from(!in_place);
                    }
                }
            }
            let unmapped = chunks.iter().filter(|&&c| c == PeerRead::Unmapped).count();
            if allowed {
                // Peer chunks take only the free HBM the others leave, all of it if they need it.
                prop_assert_eq!(brought, unmapped.min(free.saturating_sub(missing)));
            } else {
                prop_assert_eq!(brought, unmapped);
            }
        }
    }
}
