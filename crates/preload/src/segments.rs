//! Stage 3's policy: a recorded *cycle* (the launches between two of the program's
//! synchronizations, each with the chunks it touches) cut into consecutive *segments* whose
//! working set fits in the budget, and the moves to make at each segment's first launch. Pure
//! logic, no driver (like moves.rs): cycle.rs records and follows, migrate.rs moves.
//!
//! # Cutting
//!
//! Greedy: a segment grows launch by launch while the union of the chunks its launches touch
//! (those that can move) fits in the capacity (the budget in chunks, less the pinned chunks in
//! HBM). The working set of a range of launches only grows as the range does, so extending each
//! segment as far as it goes gives the fewest segments — each costs a pause. A launch whose own
//! chunks exceed the capacity gets a segment of its own and finds part of them on the host
//! (slow, never wrong: host chunks stay mapped).
//!
//! Fewest pauses is not always fewest moves (a segment holds all it touches to its end), and
//! shorter cuts can move fewer chunks; but on the H200 the cheapest of cuts at 100% to 60% of
//! the capacity, a pause counted as ten moves, ran a training step at half its peak in 1.34 s
//! against 1.08 s for the greedy cut (BENCHMARKS.md, seventeenth session): pauses cost more
//! than their moves say. Greedy it is.
//!
//! # Moves at a boundary
//!
//! Up: the segment's chunks on the host. Down: as many HBM chunks as the capacity needs, never
//! one the segment touches, those whose next use is furthest first (Belady), the next use
//! looked for in the recorded cycle after the segment, wrapping to the next cycle's start; a
//! chunk the cycle never touches is the first to go. Pinned chunks never move.
//!
//! When every chunk that can move fits in the capacity, the first segment brings up every one
//! on the host, those no launch touches too: a kernel may reach them through pointers tiermem
//! never saw (a budget that grew back after a cut leaves such chunks on the host otherwise, read
//! over PCIe for as long as the program runs).

/// One segment: its first launch (an index in the cycle) and the moves before it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Segment {
    pub start: usize,
    pub up: Vec<usize>,
    pub down: Vec<usize>,
}

impl Segment {
    pub fn moves(&self) -> usize {
        self.up.len() + self.down.len()
    }
}

/// What the policy is given: per launch of the cycle, the ids (`0..chunks`) of the chunks it
/// touches; which chunks are in HBM at the cycle's start; which cannot move; the budget.
pub struct Cycle<'a> {
    pub launches: &'a [Vec<usize>],
    pub in_hbm: &'a [bool],
    pub pinned: &'a [bool],
    /// HBM the chunks may take, in chunks (the margin already taken off).
    pub budget: usize,
}

/// Cuts the cycle into segments, the first starting at launch 0 (module documentation): each as
/// long as the capacity allows. Nothing for an empty cycle.
pub fn plan(cycle: &Cycle) -> Vec<Segment> {
    let Cycle { launches, in_hbm, pinned, budget } = *cycle;
    let chunks = in_hbm.len();
    let movable = |c: &usize| *c < chunks && !pinned[*c];
    let pinned_hbm = (0..chunks).filter(|&c| pinned[c] && in_hbm[c]).count();
    let capacity = budget.saturating_sub(pinned_hbm);

    // Cut: each segment as long as its working set (movable chunks) fits. A segment's set is
    // its chunks in order and a membership mark per chunk (planning runs at every
    // synchronization, several cuts each time: no tree, no hashing).
    let mut cuts: Vec<(usize, Vec<usize>)> = Vec::new();
    let (mut start, mut set, mut member) = (0, Vec::new(), vec![false; chunks]);
    let mut close = |start: usize, set: &mut Vec<usize>, member: &mut [bool]| {
        set.iter().for_each(|&c| member[c] = false);
        let mut done = std::mem::take(set);
        done.sort_unstable();
        cuts.push((start, done));
    };
    let mut open = false;
    for (i, touched) in launches.iter().enumerate() {
        // The launch's movable chunks not in the segment yet.
        let fresh = |member: &[bool]| {
            let mut own: Vec<usize> = touched.iter().copied().filter(|c| movable(c) && !member[*c]).collect();
            own.sort_unstable();
            own.dedup();
            own
        };
        let mut own = fresh(&member);
        if open && set.len() + own.len() > capacity {
            close(start, &mut set, &mut member);
            open = false;
            own = fresh(&member);
        }
        if !open {
            (start, open) = (i, true);
        }
        own.iter().for_each(|&c| member[c] = true);
        set.extend(own);
        // A launch that alone exceeds the capacity is a segment of its own.
        if set.len() > capacity {
            close(start, &mut set, &mut member);
            open = false;
        }
    }
    if open {
        close(start, &mut set, &mut member);
    }

    // Uses of each chunk, in launch order, for the next-use lookups.
    let mut uses: Vec<Vec<usize>> = vec![Vec::new(); chunks];
    for (i, touched) in launches.iter().enumerate() {
        for &c in touched.iter().filter(|c| movable(c)) {
            if uses[c].last() != Some(&i) {
                uses[c].push(i);
            }
        }
    }
    let length = launches.len();
    // The next use of chunk `c` at or after launch `from`, counted on past the cycle's end.
    let next_use = |c: usize, from: usize| -> usize {
        let list = &uses[c];
        let Some(&first) = list.first() else { return usize::MAX };
        let at = list.partition_point(|&i| i < from);
        list.get(at).copied().unwrap_or(length + first)
    };

    let mut hbm = in_hbm.to_vec();
    let everything_fits = (0..chunks).filter(|&c| !pinned[c]).count() <= capacity;
    let mut segments = Vec::with_capacity(cuts.len());
    for (s, (start, set)) in cuts.iter().enumerate() {
        let end = cuts.get(s + 1).map_or(length, |(next, _)| *next);
        let resident = (0..chunks).filter(|&c| hbm[c] && !pinned[c]).count();
        let mut up: Vec<usize> = match s == 0 && everything_fits {
            true => (0..chunks).filter(|&c| !hbm[c] && !pinned[c]).collect(),
            false => set.iter().copied().filter(|&c| !hbm[c]).collect(),
        };
        // An oversized segment brings up what fits once its own chunks in HBM stay.
        let keep = set.iter().filter(|&&c| hbm[c]).count();
        up.truncate(capacity.saturating_sub(keep));
        let excess = (resident + up.len()).saturating_sub(capacity);
        set.iter().for_each(|&c| member[c] = true);
        let mut victims: Vec<(usize, usize)> =
            (0..chunks).filter(|&c| hbm[c] && !pinned[c] && !member[c]).map(|c| (next_use(c, end), c)).collect();
        set.iter().for_each(|&c| member[c] = false);
        // Furthest next use first; ties by id, for determinism.
        victims.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let down: Vec<usize> = victims.into_iter().take(excess).map(|(_, c)| c).collect();
        // Should victims run short (not with the capacity counted above), fewer come up.
        up.truncate(capacity.saturating_sub(resident - down.len()));
        for &c in &down {
            hbm[c] = false;
        }
        for &c in &up {
            hbm[c] = true;
        }
        segments.push(Segment { start: *start, up, down });
    }
    segments
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn run(launches: &[Vec<usize>], in_hbm: &[bool], budget: usize) -> Vec<Segment> {
        let pinned = vec![false; in_hbm.len()];
        plan(&Cycle { launches, in_hbm, pinned: &pinned, budget })
    }

    #[test]
    fn a_cycle_that_fits_and_is_resident_moves_nothing() {
        let launches = vec![vec![0, 1], vec![1, 2], vec![0]];
        let segments = run(&launches, &[true, true, true, false], 3);
        assert_eq!(segments, [Segment { start: 0, up: vec![], down: vec![] }]);
        assert!(run(&[], &[true], 1).is_empty(), "an empty cycle has no segments");
    }

    #[test]
    fn when_everything_fits_chunks_no_launch_touches_come_up_too() {
        let launches = vec![vec![0], vec![1]];
        let segments = run(&launches, &[true, false, false], 3);
        assert_eq!(segments, [Segment { start: 0, up: vec![1, 2], down: vec![] }], "2 is never touched");
        let short = run(&launches, &[true, false, false], 2);
        assert_eq!(short, [Segment { start: 0, up: vec![1], down: vec![] }], "no room for all: what launches touch");
    }

    #[test]
    fn a_loop_over_more_than_the_budget_pages_by_belady() {
        // Six buffers of two chunks each, one launch each, 8 chunks of budget; 0..=3 in HBM.
        let launches: Vec<Vec<usize>> = (0..6).map(|b| vec![2 * b, 2 * b + 1]).collect();
        let in_hbm: Vec<bool> = (0..12).map(|c| c < 8).collect();
        let segments = run(&launches, &in_hbm, 8);
        assert_eq!(segments.len(), 2, "{segments:?}");
        assert_eq!((segments[0].start, segments[0].moves()), (0, 0), "the first four buffers are in HBM already");
        assert_eq!(segments[1].start, 4);
        assert_eq!(segments[1].up, [8, 9, 10, 11]);
        // Buffers 2 and 3 are used last in the next cycle: they go.
        let mut down = segments[1].down.clone();
        down.sort_unstable();
        assert_eq!(down, [4, 5, 6, 7]);
    }

    #[test]
    fn a_launch_larger_than_the_budget_is_a_segment_of_its_own() {
        let launches = vec![vec![0], vec![1, 2, 3, 4], vec![0]];
        let segments = run(&launches, &[true, false, false, false, false], 2);
        let starts: Vec<usize> = segments.iter().map(|s| s.start).collect();
        assert_eq!(starts, [0, 1, 2]);
        assert_eq!(segments[1].up.len(), 2, "what fits comes up");
        assert_eq!(segments[1].down, [0]);
    }

    #[test]
    fn pinned_chunks_stay_and_take_their_room() {
        let launches = vec![vec![0, 1], vec![2]];
        let pinned = [false, false, false, true];
        let segments =
            plan(&Cycle { launches: &launches, in_hbm: &[true, true, false, true], pinned: &pinned, budget: 3 });
        assert_eq!(segments.len(), 2);
        assert_eq!((segments[1].up.as_slice(), segments[1].down.len()), (&[2][..], 1));
    }

    fn cycles() -> impl Strategy<Value = (Vec<Vec<usize>>, Vec<bool>, Vec<bool>, usize)> {
        (1usize..24).prop_flat_map(|chunks| {
            (
                prop::collection::vec(prop::collection::vec(0..chunks, 0..5), 0..40),
                prop::collection::vec(any::<bool>(), chunks),
                prop::collection::vec(prop::bool::weighted(0.15), chunks),
                0usize..16,
            )
        })
    }

    /// Start within the budget: drops HBM chunks (movable first) beyond it.
    fn within_budget(in_hbm: Vec<bool>, pinned: &[bool], budget: usize) -> Vec<bool> {
        let mut in_hbm = in_hbm;
        let mut extra = in_hbm.iter().filter(|&&h| h).count().saturating_sub(budget);
        for order in [false, true] {
            for c in 0..in_hbm.len() {
                if extra > 0 && in_hbm[c] && pinned[c] == order {
                    in_hbm[c] = false;
                    extra -= 1;
                }
            }
        }
        in_hbm
    }

    proptest! {
        #[test]
        fn plans_keep_the_budget_and_bring_in_what_fits(
            (launches, in_hbm, pinned, budget) in cycles()
        ) {
            let in_hbm = within_budget(in_hbm, &pinned, budget);
            let segments = plan(&Cycle { launches: &launches, in_hbm: &in_hbm, pinned: &pinned, budget });
            prop_assert_eq!(segments.is_empty(), launches.is_empty());
            let pinned_hbm = (0..in_hbm.len()).filter(|&c| pinned[c] && in_hbm[c]).count();
            let capacity = budget.saturating_sub(pinned_hbm);
            let mut hbm = in_hbm.clone();
            for (s, segment) in segments.iter().enumerate() {
                let end = segments.get(s + 1).map_or(launches.len(), |n| n.start);
                prop_assert!(segment.start < end, "segments are consecutive and not empty");
                for &c in &segment.down {
                    prop_assert!(hbm[c] && !pinned[c], "down: a movable HBM chunk");
                    hbm[c] = false;
                }
                for &c in &segment.up {
                    prop_assert!(!hbm[c] && !pinned[c], "up: a movable host chunk");
                    hbm[c] = true;
                }
                prop_assert!(hbm.iter().filter(|&&h| h).count() <= budget, "the budget holds after the moves");
                let set: BTreeSet<usize> =
                    launches[segment.start..end].iter().flatten().copied().filter(|&c| !pinned[c]).collect();
                if set.len() <= capacity {
                    for &c in &set {
                        prop_assert!(hbm[c], "chunk {} of a segment that fits is in HBM", c);
                    }
                } else {
                    prop_assert_eq!(end - segment.start, 1, "only a single launch may exceed the budget");
                }
                if s > 0 {
                    // Fewest segments: the previous one could not take this one's first launch.
                    let prev = &segments[s - 1];
                    let joined: BTreeSet<usize> = launches[prev.start..=segment.start]
                        .iter().flatten().copied().filter(|&c| !pinned[c]).collect();
                    prop_assert!(joined.len() > capacity);
                }
            }
            let all: BTreeSet<usize> = launches.iter().flatten().copied().filter(|&c| !pinned[c]).collect();
            let movable = (0..in_hbm.len()).filter(|&c| !pinned[c]).count();
            if all.len() <= capacity && all.iter().all(|&c| in_hbm[c]) && movable > capacity {
                prop_assert!(segments.iter().all(|s| s.moves() == 0), "a resident cycle that fits moves nothing");
            }
            if movable <= capacity && !segments.is_empty() {
                let after_first: Vec<bool> = (0..in_hbm.len()).map(|c| in_hbm[c] || segments[0].up.contains(&c)).collect();
                prop_assert!((0..in_hbm.len()).all(|c| pinned[c] || after_first[c]), "everything fits: all comes up");
                prop_assert!(segments[0].down.is_empty(), "and nothing goes down for it");
            }
            if all.len() <= capacity {
                prop_assert!(segments.len() <= 1, "a cycle that fits is one segment");
            }
        }

        #[test]
        fn plans_are_deterministic((launches, in_hbm, pinned, budget) in cycles()) {
            let cycle = Cycle { launches: &launches, in_hbm: &in_hbm, pinned: &pinned, budget };
            prop_assert_eq!(plan(&cycle), plan(&cycle));
        }
    }
}
