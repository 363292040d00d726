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
/// touches; which chunks are in HBM at the cycle's start; which cannot move; each chunk's size;
/// the budget.
pub struct Cycle<'a> {
    pub launches: &'a [Vec<usize>],
    pub in_hbm: &'a [bool],
    pub pinned: &'a [bool],
    /// Each chunk's bytes (or any unit, the budget's): a program's allocations are cut into
    /// chunks of one size but the last, and a stream-ordered allocator's are often smaller
    /// than one chunk (PyTorch's `cudaMallocAsync` backend makes one per tensor), so working
    /// sets are weighed, not counted.
    pub sizes: &'a [usize],
    /// HBM the chunks may take, in the unit of `sizes` (the margin already taken off).
    pub budget: usize,
}

/// A segment being cut: its first launch, its chunks in order, their size in all.
struct Cut {
    start: usize,
    set: Vec<usize>,
    size: usize,
}

/// Cuts the cycle into segments, the first starting at launch 0 (module documentation): each as
/// long as the capacity allows. Nothing for an empty cycle.
pub fn plan(cycle: &Cycle) -> Vec<Segment> {
    let Cycle { launches, in_hbm, pinned, sizes, budget } = *cycle;
    let chunks = in_hbm.len();
    let movable = |c: &usize| *c < chunks && !pinned[*c];
    let weigh = |set: &mut dyn Iterator<Item = usize>| set.map(|c| sizes[c]).sum::<usize>();
    let pinned_hbm = weigh(&mut (0..chunks).filter(|&c| pinned[c] && in_hbm[c]));
    let capacity = budget.saturating_sub(pinned_hbm);

    // Cut: each segment as long as its working set (movable chunks) fits. A segment's set is
    // its chunks in order and a membership mark per chunk (planning runs at every
    // synchronization, several cuts each time: no tree, no hashing).
    let mut cuts: Vec<(usize, Vec<usize>)> = Vec::new();
    let mut member = vec![false; chunks];
    let mut close = |cut: &mut Option<Cut>, member: &mut [bool]| {
        if let Some(Cut { start, mut set, .. }) = cut.take() {
            set.iter().for_each(|&c| member[c] = false);
            set.sort_unstable();
            cuts.push((start, set));
        }
    };
    let mut cut: Option<Cut> = None;
    for (i, touched) in launches.iter().enumerate() {
        // The launch's movable chunks not in the segment yet.
        let fresh = |member: &[bool]| {
            let mut own: Vec<usize> = touched.iter().copied().filter(|c| movable(c) && !member[*c]).collect();
            own.sort_unstable();
            own.dedup();
            own
        };
        let mut own = fresh(&member);
        let own_size = weigh(&mut own.iter().copied());
        if cut.as_ref().is_some_and(|cut| cut.size + own_size > capacity) {
            close(&mut cut, &mut member);
            own = fresh(&member);
        }
        let open = cut.get_or_insert(Cut { start: i, set: Vec::new(), size: 0 });
        own.iter().for_each(|&c| member[c] = true);
        open.size += weigh(&mut own.iter().copied());
        open.set.extend(own);
        // A launch that alone exceeds the capacity is a segment of its own.
        if open.size > capacity {
            close(&mut cut, &mut member);
        }
    }
    close(&mut cut, &mut member);

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
    let everything_fits = weigh(&mut (0..chunks).filter(|&c| !pinned[c])) <= capacity;
    let mut segments = Vec::with_capacity(cuts.len());
    for (s, (start, set)) in cuts.iter().enumerate() {
        let end = cuts.get(s + 1).map_or(length, |(next, _)| *next);
        let resident = weigh(&mut (0..chunks).filter(|&c| hbm[c] && !pinned[c]));
        let wanted: Vec<usize> = match s == 0 && everything_fits {
            true => (0..chunks).filter(|&c| !hbm[c] && !pinned[c]).collect(),
            false => set.iter().copied().filter(|&c| !hbm[c]).collect(),
        };
        // An oversized segment brings up what fits once its own chunks in HBM stay.
        let keep = weigh(&mut set.iter().copied().filter(|&c| hbm[c]));
        let mut up = fitting(wanted, sizes, capacity.saturating_sub(keep));
        let excess = (resident + weigh(&mut up.iter().copied())).saturating_sub(capacity);
        set.iter().for_each(|&c| member[c] = true);
        let mut victims: Vec<(usize, usize)> =
            (0..chunks).filter(|&c| hbm[c] && !pinned[c] && !member[c]).map(|c| (next_use(c, end), c)).collect();
        set.iter().for_each(|&c| member[c] = false);
        // Furthest next use first; ties by id, for determinism.
        victims.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut freed = 0;
        let down: Vec<usize> = victims
            .into_iter()
            .map(|(_, c)| c)
            .take_while(|&c| {
                let more = freed < excess;
                freed += sizes[c];
                more
            })
            .collect();
        // Should victims run short (not with the capacity counted above), fewer come up.
        up = fitting(up, sizes, capacity.saturating_sub(resident - weigh(&mut down.iter().copied())));
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

/// The first of `chunks`, in order, whose sizes add up to at most `room`.
fn fitting(chunks: Vec<usize>, sizes: &[usize], room: usize) -> Vec<usize> {
    let mut taken = 0;
    chunks
        .into_iter()
        .take_while(|&c| {
            taken += sizes[c];
            taken <= room
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn run(launches: &[Vec<usize>], in_hbm: &[bool], budget: usize) -> Vec<Segment> {
        let (pinned, sizes) = (vec![false; in_hbm.len()], vec![1; in_hbm.len()]);
        plan(&Cycle { launches, in_hbm, pinned: &pinned, sizes: &sizes, budget })
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
        let in_hbm = [true, true, false, true];
        let segments =
            plan(&Cycle { launches: &launches, in_hbm: &in_hbm, pinned: &pinned, sizes: &[1; 4], budget: 3 });
        assert_eq!(segments.len(), 2);
        assert_eq!((segments[1].up.as_slice(), segments[1].down.len()), (&[2][..], 1));
    }

    #[test]
    fn working_sets_are_weighed_not_counted() {
        // Chunk 0 is a whole chunk (8 units), 1..=4 are small allocations of 2, one launch
        // each, under a budget of 12: 0, 1 and 2 fill it, so the last two small ones are a
        // segment of their own, and what makes room for them is just enough (4 units) of the
        // chunks whose next use is furthest: 2 and 1, not the big chunk the next cycle begins
        // with. Counted as five chunks under a budget of 12 they would all "fit" at once.
        let launches = vec![vec![0], vec![1], vec![2], vec![3], vec![4]];
        let (in_hbm, pinned) = ([true, true, true, false, false], [false; 5]);
        let cycle = |sizes: &'static [usize]| Cycle {
            launches: &launches,
            in_hbm: &in_hbm,
            pinned: &pinned,
            sizes,
            budget: 12,
        };
        let weighed = plan(&cycle(&[8, 2, 2, 2, 2]));
        let starts: Vec<usize> = weighed.iter().map(|s| s.start).collect();
        assert_eq!(starts, [0, 3], "{weighed:?}");
        assert_eq!((weighed[1].up.as_slice(), weighed[1].down.as_slice()), (&[3, 4][..], &[2, 1][..]));
        assert_eq!(plan(&cycle(&[1; 5])).len(), 1, "counted, one segment");
    }

    type Generated = (Vec<Vec<usize>>, Vec<bool>, Vec<bool>, Vec<usize>, usize);

    /// Cycles over chunks of 1 to 4 units (most of one: whole chunks), budgets of 0 to 31.
    fn cycles() -> impl Strategy<Value = Generated> {
        (1usize..24).prop_flat_map(|chunks| {
            (
                prop::collection::vec(prop::collection::vec(0..chunks, 0..5), 0..40),
                prop::collection::vec(any::<bool>(), chunks),
                prop::collection::vec(prop::bool::weighted(0.15), chunks),
                prop::collection::vec(prop_oneof![3 => Just(1usize), 1 => 2usize..5], chunks),
                0usize..32,
            )
        })
    }

    fn weight(set: impl IntoIterator<Item = usize>, sizes: &[usize]) -> usize {
        set.into_iter().map(|c| sizes[c]).sum()
    }

    /// Start within the budget: drops HBM chunks (movable first) beyond it.
    fn within_budget(in_hbm: Vec<bool>, pinned: &[bool], sizes: &[usize], budget: usize) -> Vec<bool> {
        let mut in_hbm = in_hbm;
        for order in [false, true] {
            for c in 0..in_hbm.len() {
                if weight((0..in_hbm.len()).filter(|&c| in_hbm[c]), sizes) > budget && in_hbm[c] && pinned[c] == order {
                    in_hbm[c] = false;
                }
            }
        }
        in_hbm
    }

    proptest! {
        #[test]
        fn plans_keep_the_budget_and_bring_in_what_fits(
            (launches, in_hbm, pinned, sizes, budget) in cycles()
        ) {
            let in_hbm = within_budget(in_hbm, &pinned, &sizes, budget);
            let segments = plan(&Cycle { launches: &launches, in_hbm: &in_hbm, pinned: &pinned, sizes: &sizes, budget });
            prop_assert_eq!(segments.is_empty(), launches.is_empty());
            let pinned_hbm = weight((0..in_hbm.len()).filter(|&c| pinned[c] && in_hbm[c]), &sizes);
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
                prop_assert!(weight((0..hbm.len()).filter(|&c| hbm[c]), &sizes) <= budget, "the budget holds after the moves");
                let set: BTreeSet<usize> =
                    launches[segment.start..end].iter().flatten().copied().filter(|&c| !pinned[c]).collect();
                if weight(set.iter().copied(), &sizes) <= capacity {
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
                    prop_assert!(weight(joined, &sizes) > capacity);
                }
            }
            let all: BTreeSet<usize> = launches.iter().flatten().copied().filter(|&c| !pinned[c]).collect();
            let all_size = weight(all.iter().copied(), &sizes);
            let movable = weight((0..in_hbm.len()).filter(|&c| !pinned[c]), &sizes);
            if all_size <= capacity && all.iter().all(|&c| in_hbm[c]) && movable > capacity {
                prop_assert!(segments.iter().all(|s| s.moves() == 0), "a resident cycle that fits moves nothing");
            }
            if movable <= capacity && !segments.is_empty() {
                let after_first: Vec<bool> = (0..in_hbm.len()).map(|c| in_hbm[c] || segments[0].up.contains(&c)).collect();
                prop_assert!((0..in_hbm.len()).all(|c| pinned[c] || after_first[c]), "everything fits: all comes up");
                prop_assert!(segments[0].down.is_empty(), "and nothing goes down for it");
            }
            if all_size <= capacity {
                prop_assert!(segments.len() <= 1, "a cycle that fits is one segment");
            }
        }

        #[test]
        fn plans_are_deterministic((launches, in_hbm, pinned, sizes, budget) in cycles()) {
            let cycle = Cycle { launches: &launches, in_hbm: &in_hbm, pinned: &pinned, sizes: &sizes, budget };
            prop_assert_eq!(plan(&cycle), plan(&cycle));
        }
    }
}
