//! Which kept free (deferred.rs) an allocation takes back: the one at the address that the
//! allocation in its place in the cycle before got — the n-th allocation of its size on its GPU
//! since the last synchronization — if that one is kept and may be taken; else the oldest that
//! may (deferred.rs). Pure bookkeeping, no driver.
//!
//! Why not simply the oldest: a step that frees its tensors in the reverse of their order
//! (a backward pass frees the activations last made first) gets them back swapped the next
//! step, and swapped again the step after: with oldest first, step 1's `a, b` at addresses 1, 2
//! are freed `b, a`, so step 2's `a, b` get 2, 1, are freed 1, 2, and step 3's get 1, 2. Newest
//! first fails the other way round (tensors freed in their order). Either way the same
//! tensor lands at another address every other step, and the plan made from the step before
//! (cycle.rs), which names addresses, brings up the wrong ones: a transformer's layers make
//! activations of one size each. By place in the cycle, each tensor comes back where it was.
//!
//! A step that synchronizes more than once is several cycles (cycle.rs tells them apart by
//! their kernels): each one's places are kept apart, and the cycle predicted to come next is the
//! one whose places are wanted.
//!
//! Bounded: at most [`MAX_PLACES`] allocations a cycle, and [`CYCLES`] cycles, are remembered (a
//! program that never synchronizes has no cycle to repeat).

use std::collections::HashMap;

/// Allocations remembered per cycle at most.
pub const MAX_PLACES: usize = 1 << 16;

/// A GPU and a number of bytes reserved: the shape a reuse must match.
pub type Shape = (usize, usize);

/// A cycle's identity (cycle.rs's fingerprint of its kernels), where known.
pub type CycleKey = Option<u64>;

/// A cycle's places: the address the n-th allocation of each shape got.
type Places = HashMap<(Shape, usize), u64>;

/// Cycles whose places are remembered at most.
const CYCLES: usize = 8;

/// The addresses allocations got, by shape and place in the cycle (`n`: the n-th of its shape).
#[derive(Debug, Default)]
pub struct Orders {
    /// Each cycle's places, the last time it allocated, by its identity; oldest first.
    by_cycle: Vec<(CycleKey, Places)>,
    /// The cycle under way, as predicted (its places are the ones wanted).
    expected: CycleKey,
    /// This cycle's so far.
    now: Places,
    /// Allocations of each shape so far this cycle.
    counts: HashMap<Shape, usize>,
}

impl Orders {
    pub fn new() -> Orders {
        Orders::default()
    }

    /// The address that the allocation in the next allocation's place got, the last time the
    /// cycle under way ran.
    pub fn wanted(&self, shape: Shape) -> Option<u64> {
        let n = self.counts.get(&shape).copied().unwrap_or(0);
        let (_, places) = self.by_cycle.iter().find(|(key, _)| *key == self.expected)?;
        places.get(&(shape, n)).copied()
    }

    /// An allocation of `shape` was served at `va`.
    pub fn served(&mut self, shape: Shape, va: u64) {
        let n = self.counts.entry(shape).or_insert(0);
        if self.now.len() < MAX_PLACES {
            self.now.insert((shape, *n), va);
        }
        *n += 1;
    }

    /// The program synchronized: cycle `ended` is over, and `next` is predicted (cycle.rs;
    /// `None` where cycles are not told apart). A step of several cycles (the step, then a
    /// short one reading the loss) keeps each one's places apart; a cycle that allocated nothing
    /// leaves its places as they were. Whether this one allocated.
    pub fn cycle_ends(&mut self, ended: CycleKey, next: CycleKey) -> bool {
        self.counts.clear();
        self.expected = next;
        let allocated = !self.now.is_empty();
        if allocated {
            self.by_cycle.retain(|(key, _)| *key != ended);
            self.by_cycle.push((ended, std::mem::take(&mut self.now)));
            if self.by_cycle.len() > CYCLES {
                self.by_cycle.remove(0);
            }
        }
        allocated
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Steps that allocate `sizes` in order and free them in `free_order`, over kept frees taken
    /// back by place (else oldest first, as deferred.rs does); the addresses each step got.
    fn steps(sizes: &[usize], free_order: &[usize], count: usize) -> Vec<Vec<u64>> {
        let (mut orders, mut kept, mut next) = (Orders::new(), Vec::<(usize, u64)>::new(), 0x1000u64);
        let mut out = Vec::new();
        for _ in 0..count {
            let mut got = Vec::new();
            for &size in sizes {
                let shape = (0, size);
                let wanted = orders.wanted(shape);
                let at = kept
                    .iter()
                    .position(|&(s, va)| s == size && Some(va) == wanted)
                    .or_else(|| kept.iter().position(|&(s, _)| s == size));
                let va = match at {
                    Some(at) => kept.remove(at).1,
                    None => {
                        next += 0x1000;
                        next
                    }
                };
                orders.served(shape, va);
                got.push(va);
            }
            for &i in free_order {
                kept.push((sizes[i], got[i]));
            }
            orders.cycle_ends(None, None);
            out.push(got);
        }
        out
    }

    #[test]
    fn tensors_freed_in_reverse_come_back_where_they_were() {
        let got = steps(&[2, 2, 2], &[2, 1, 0], 4);
        assert!(got.iter().all(|step| *step == got[0]), "{got:x?}");
    }

    #[test]
    fn a_cycle_that_allocates_nothing_keeps_the_one_before() {
        let mut orders = Orders::new();
        orders.served((0, 2), 0x10);
        orders.cycle_ends(None, None);
        orders.cycle_ends(None, None);
        assert_eq!(orders.wanted((0, 2)), Some(0x10));
        assert_eq!(orders.wanted((1, 2)), None, "another GPU");
    }

    #[test]
    fn each_cycle_of_a_step_has_its_own_places() {
        // A step: cycle 1 (the step) makes two tensors of one size, cycle 2 (reading the loss)
        // one more of that size at another address. Cycle 1 wants its own places again.
        let mut orders = Orders::new();
        orders.served((0, 2), 0xa);
        orders.served((0, 2), 0xb);
        orders.cycle_ends(Some(1), Some(2));
        assert_eq!(orders.wanted((0, 2)), None, "cycle 2 has not run yet");
        orders.served((0, 2), 0xc);
        orders.cycle_ends(Some(2), Some(1));
        assert_eq!(orders.wanted((0, 2)), Some(0xa));
        orders.served((0, 2), 0xa);
        assert_eq!(orders.wanted((0, 2)), Some(0xb));
        orders.served((0, 2), 0xb);
        orders.cycle_ends(Some(1), Some(2));
        assert_eq!(orders.wanted((0, 2)), Some(0xc));
    }

    proptest! {
        /// Whatever the sizes and the order of the frees, every step from the second on gets
        /// the addresses the first got.
        #[test]
        fn every_step_repeats_the_first(
            sizes in proptest::collection::vec(1usize..4, 1..12),
            seed in any::<u64>(),
        ) {
            let mut free_order: Vec<usize> = (0..sizes.len()).collect();
            // A permutation from the seed (Fisher–Yates with a xorshift).
            let mut state = seed | 1;
            for i in (1..free_order.len()).rev() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                free_order.swap(i, (state % (i as u64 + 1)) as usize);
            }
            let got = steps(&sizes, &free_order, 4);
            prop_assert!(got.iter().all(|step| *step == got[0]), "{:x?}", got);
        }
    }
}
