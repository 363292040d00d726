//! Stride prefetch (memHarvester §4.3.2): when a program walks a buffer in one direction,
//! bring in what comes next before it is asked for.
//!
//! Each buffer keeps the chunk range of its last acquire. An acquire that starts after the last
//! one started, no further than `ahead` chunks past its end, continues forwards; one that ends
//! before the last one ended, no further than `ahead` chunks before its start, continues
//! backwards (a stride of a few chunks counts, as memHarvester found it should). Two steps in
//! the same direction in a row make a walk: the next `ahead` chunks beyond the acquire, in
//! that direction, are worth bringing in. Anything else (a repeat, a jump, a turn) starts
//! over. Pure and deterministic: the engine feeds it acquires and prefetches what it answers.

/// The walk through one buffer, as far as its acquires tell.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stride {
    /// The chunk range `[first, end)` of the last acquire.
    last: Option<(usize, usize)>,
    /// +1 forwards, -1 backwards, 0 not moving.
    direction: i8,
    /// Steps in a row in `direction`.
    steps: u32,
}

impl Stride {
    /// Takes an acquire of chunks `[first, end)` of a buffer of `len` chunks; returns the range
    /// of chunks to prefetch, if this acquire continues a walk (empty ranges are not returned).
    pub fn observe(&mut self, first: usize, end: usize, len: usize, ahead: usize) -> Option<(usize, usize)> {
        let direction = match self.last {
            Some((f, e)) if first > f && first <= e + ahead => 1,
            Some((f, e)) if end < e && end + ahead >= f => -1,
            _ => 0,
        };
        self.steps = if direction != 0 && direction == self.direction { self.steps + 1 } else { 1 };
        self.direction = direction;
        self.last = Some((first, end));
        if direction == 0 || self.steps < 2 || ahead == 0 {
            return None;
        }
        let window = match direction {
            1 => (end.min(len), end.saturating_add(ahead).min(len)),
            _ => (first.saturating_sub(ahead), first),
        };
        (window.0 < window.1).then_some(window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_walk_forwards_or_backwards_prefetches_what_comes_next() {
        let mut s = Stride::default();
        assert_eq!(s.observe(0, 2, 100, 16), None, "one acquire is no walk");
        assert_eq!(s.observe(2, 4, 100, 16), None, "one step is no walk");
        assert_eq!(s.observe(4, 6, 100, 16), Some((6, 22)));
        assert_eq!(s.observe(8, 9, 100, 16), Some((9, 25)), "a stride continues it");
        assert_eq!(s.observe(95, 99, 100, 16), None, "a jump starts over");

        let mut s = Stride::default();
        s.observe(90, 92, 100, 16);
        s.observe(88, 90, 100, 16);
        assert_eq!(s.observe(86, 88, 100, 16), Some((70, 86)));
        assert_eq!(s.observe(86, 88, 100, 16), None, "a repeat starts over");
        assert_eq!(s.observe(90, 92, 100, 16), None, "so does a turn");

        let mut s = Stride::default();
        s.observe(96, 97, 100, 16);
        s.observe(97, 98, 100, 16);
        assert_eq!(s.observe(98, 100, 100, 16), None, "nothing left ahead");
    }

    proptest! {
        #[test]
        fn a_window_lies_in_the_buffer_beside_the_acquire_and_only_after_two_steps(
            acquires in prop::collection::vec((0usize..64, 1usize..8), 1..40), ahead in 0usize..20
        ) {
            let (len, mut s) = (64, Stride::default());
            let mut previous: Vec<(usize, usize)> = Vec::new();
            for (first, n) in acquires {
                let end = (first + n).min(len);
                if let Some((a, b)) = s.observe(first, end, len, ahead) {
                    prop_assert!(a < b && b <= len && b - a <= ahead);
                    prop_assert!(a == end || b == first, "beside the acquire");
                    prop_assert!(previous.len() >= 2);
                }
                previous.push((first, end));
            }
        }
    }
}
