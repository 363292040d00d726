//! Slot bookkeeping: which slots are free (as runs, so that contiguous allocation is cheap),
//! and for each allocated slot the crc32c of its contents, if it has any.

use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SlotState {
    Free,
    /// Handed out by `alloc`; `crc` is the crc32c of the last complete write, `None` when the
    /// slot holds no data (never written, or its last write failed).
    Allocated {
        crc: Option<u32>,
    },
    /// Being freed: its hole is being punched; neither allocatable nor usable.
    Freeing,
}

#[derive(Debug)]
pub(super) struct Slots {
    /// Free runs: first slot → length (> 0). Runs never touch: adjacent runs are merged.
    runs: BTreeMap<u32, u32>,
    state: Vec<SlotState>,
    used: usize,
}

impl Slots {
    pub fn new(capacity: u32) -> Self {
        let mut runs = BTreeMap::new();
        if capacity > 0 {
            runs.insert(0, capacity);
        }
        Slots { runs, state: vec![SlotState::Free; capacity as usize], used: 0 }
    }

    pub fn capacity(&self) -> usize {
        self.state.len()
    }

    /// Slots allocated or being freed.
    pub fn used(&self) -> usize {
        self.used
    }

    pub fn state(&self, slot: u32) -> Option<SlotState> {
        self.state.get(slot as usize).copied()
    }

    pub fn set_crc(&mut self, slot: u32, crc: Option<u32>) {
        if let Some(s @ SlotState::Allocated { .. }) = self.state.get_mut(slot as usize) {
            *s = SlotState::Allocated { crc };
        }
    }

    /// `n` free slots, in ascending order: the lowest run that holds all of them if there is
    /// one, otherwise pieces of the largest runs. `None` (taking nothing) if fewer are free.
    pub fn alloc(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.capacity() - self.used {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        if n == 0 {
            return Some(out);
        }
        let fit = self.runs.iter().find(|(_, &len)| len as usize >= n).map(|(&start, _)| start);
        if let Some(start) = fit {
            self.take(start, n as u32, &mut out);
        } else {
            let mut by_len: Vec<(u32, u32)> = self.runs.iter().map(|(&s, &l)| (s, l)).collect();
            by_len.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            let mut left = n as u32;
            for (start, len) in by_len {
                let k = len.min(left);
                self.take(start, k, &mut out);
                left -= k;
                if left == 0 {
                    break;
                }
            }
            out.sort_unstable();
        }
        Some(out)
    }

    /// Takes the first `k` slots of the free run starting at `start`.
    fn take(&mut self, start: u32, k: u32, out: &mut Vec<u32>) {
        let len = self.runs.remove(&start).expect("free run exists");
        if k < len {
            self.runs.insert(start + k, len - k);
        }
        for s in start..start + k {
            self.state[s as usize] = SlotState::Allocated { crc: None };
            out.push(s);
        }
        self.used += k as usize;
    }

    /// Marks allocated slots as being freed. Changes nothing if one is out of range, not
    /// allocated, or listed twice (the error names it).
    pub fn begin_free(&mut self, slots: &[u32]) -> Result<(), (u32, String)> {
        let mut marked: Vec<(u32, SlotState)> = Vec::with_capacity(slots.len());
        for (i, &s) in slots.iter().enumerate() {
            let why = match self.state.get(s as usize) {
                None => format!("is out of range (capacity {} slots)", self.capacity()),
                Some(&prev @ SlotState::Allocated { .. }) => {
                    self.state[s as usize] = SlotState::Freeing;
                    marked.push((s, prev));
                    continue;
                }
                Some(_) if slots[..i].contains(&s) => "is listed twice".to_string(),
                Some(_) => "is not allocated (double free?)".to_string(),
            };
            for (m, prev) in marked {
                self.state[m as usize] = prev;
            }
            return Err((s, why));
        }
        Ok(())
    }

    /// Returns slots marked by `begin_free` to the free runs.
    pub fn finish_free(&mut self, slots: &[u32]) {
        for &s in slots {
            debug_assert_eq!(self.state[s as usize], SlotState::Freeing);
            self.state[s as usize] = SlotState::Free;
            self.insert_run(s, 1);
            self.used -= 1;
        }
    }

    fn insert_run(&mut self, mut start: u32, mut len: u32) {
        if let Some((&ps, &pl)) = self.runs.range(..start).next_back() {
            debug_assert!(ps + pl <= start, "free runs overlap");
            if ps + pl == start {
                self.runs.remove(&ps);
                start = ps;
                len += pl;
            }
        }
        if let Some(&nl) = self.runs.get(&(start + len)) {
            self.runs.remove(&(start + len));
            len += nl;
        }
        self.runs.insert(start, len);
    }
}

/// Maximal runs of consecutive slots in `sorted` (ascending): (first, count).
pub(super) fn runs_of(sorted: &[u32]) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    for &s in sorted {
        match out.last_mut() {
            Some((first, count)) if *first + *count == s => *count += 1,
            _ => out.push((s, 1)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_first_then_pieces() {
        let mut s = Slots::new(10);
        assert_eq!(s.alloc(3), Some(vec![0, 1, 2]));
        assert_eq!(s.alloc(3), Some(vec![3, 4, 5]));
        s.begin_free(&[1]).unwrap();
        s.finish_free(&[1]);
        // Run [1] is too short; [6..10) holds 2.
        assert_eq!(s.alloc(2), Some(vec![6, 7]));
        assert_eq!(s.alloc(3), Some(vec![1, 8, 9]));
        assert_eq!(s.alloc(1), None);
        assert_eq!(s.used(), 10);
        s.begin_free(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]).unwrap();
        s.finish_free(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(s.runs.len(), 1);
        assert_eq!(s.alloc(10).unwrap().len(), 10);
    }

    #[test]
    fn free_checks_everything_first() {
        let mut s = Slots::new(4);
        s.alloc(2).unwrap();
        assert!(s.begin_free(&[0, 2]).is_err());
        assert!(s.begin_free(&[0, 0]).is_err());
        assert!(s.begin_free(&[9]).is_err());
        assert_eq!(s.state(0), Some(SlotState::Allocated { crc: None }));
        assert_eq!(runs_of(&[0, 1, 2, 5, 7, 8]), vec![(0, 3), (5, 1), (7, 2)]);
    }
}
