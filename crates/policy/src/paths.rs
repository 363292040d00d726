//! Two links into the GPU (memHarvester §4.3.1, GLake's multi-path copies): how a page-in from
//! host memory is divided between the paths into this GPU.
//!
//! Each path is a PCIe link: this GPU's own, and each idle neighbour's (host memory → the
//! neighbour's copy engine → NVLink → this GPU's HBM). The links run at about the same speed,
//! so the bytes are divided evenly: the page-in's runs of consecutive chunks (one copy each)
//! are laid end to end and cut into nearly equal parts, one per path, in order, path 0 (this
//! GPU's own link) first; a run that a cut crosses becomes two copies. A second path costs an
//! event and a wait each way, so a part is at least `least` chunks: a page-in too small for
//! that uses fewer paths (one, below `2 × least`). Pure and deterministic.

/// Part of one run of chunks, copied along one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// The run (an index into the runs given).
    pub run: usize,
    /// Chunks of the run before this piece.
    pub skip: usize,
    pub chunks: usize,
    /// 0: this GPU's own link; `i > 0`: the `i`-th neighbour's.
    pub path: usize,
}

/// Divides `runs` (their lengths in chunks, in order) between at most `paths` paths, each
/// part at least `least` chunks (unless there is one part). Returns the pieces in order.
pub fn split_between_paths(runs: &[usize], paths: usize, least: usize) -> Vec<Piece> {
    let total: usize = runs.iter().sum();
    let used = paths.min(total / least.max(1)).max(1);
    // Path p takes `share(p)` chunks: the first `total % used` paths one more.
    let share = |p: usize| total / used + usize::from(p < total % used);
    let mut pieces = Vec::new();
    let (mut path, mut left_on_path) = (0, share(0));
    for (run, &len) in runs.iter().enumerate() {
        let mut skip = 0;
        while skip < len {
            if left_on_path == 0 {
                path += 1;
                left_on_path = share(path);
            }
            let chunks = left_on_path.min(len - skip);
            pieces.push(Piece { run, skip, chunks, path });
            (skip, left_on_path) = (skip + chunks, left_on_path - chunks);
        }
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn two_paths_take_half_each_and_a_crossed_run_is_cut() {
        let pieces = split_between_paths(&[3, 5], 2, 2);
        assert_eq!(
            pieces,
            vec![
                Piece { run: 0, skip: 0, chunks: 3, path: 0 },
                Piece { run: 1, skip: 0, chunks: 1, path: 0 },
                Piece { run: 1, skip: 1, chunks: 4, path: 1 },
            ]
        );
        assert!(split_between_paths(&[3], 2, 2).iter().all(|p| p.path == 0), "too small for two parts");
        assert_eq!(split_between_paths(&[], 2, 2), vec![]);
    }

    proptest! {
        #[test]
        fn every_chunk_goes_once_in_order_and_the_parts_are_even(
            runs in prop::collection::vec(1usize..40, 0..12), paths in 1usize..4, least in 1usize..8
        ) {
            let pieces = split_between_paths(&runs, paths, least);
            let mut next = (0, 0);
            let mut per_path = vec![0usize; paths];
            for p in &pieces {
                prop_assert!(p.chunks > 0);
                while next.0 < runs.len() && next.1 == runs[next.0] {
                    next = (next.0 + 1, 0);
                }
                prop_assert_eq!((p.run, p.skip), next, "pieces cover the runs in order");
                next.1 += p.chunks;
                prop_assert!(next.1 <= runs[p.run]);
                per_path[p.path] += p.chunks;
            }
            let total: usize = runs.iter().sum();
            prop_assert_eq!(per_path.iter().sum::<usize>(), total);
            let used: Vec<usize> = per_path.iter().copied().filter(|&n| n > 0).collect();
            prop_assert!(per_path[..used.len()].iter().all(|&n| n > 0), "paths are used from the first");
            let (most, fewest) = (used.iter().max().copied().unwrap_or(0), used.iter().min().copied().unwrap_or(0));
            prop_assert!(most - fewest <= 1, "{per_path:?}");
            prop_assert!(used.len() <= 1 || fewest >= least, "{per_path:?} least {least}");
            prop_assert!(pieces.windows(2).all(|w| w[0].path <= w[1].path));
        }
    }
}
