//! The address → allocation index: which allocation a device pointer falls in.
//!
//! C callers (and PyTorch) speak in device pointers, the engine in `BufferId`s. Every
//! allocation made through the C ABI is entered here under its start address and length;
//! a pointer anywhere inside `[start, start + len)` finds it. Allocations never overlap (each
//! is its own reserved VA range), so the one starting at or before a pointer is the only
//! candidate. Not synchronised: the process state (`process.rs`) holds it under its mutex.

use std::collections::BTreeMap;

/// One allocation: where it starts, how long it is, and what the front end keeps with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<T> {
    pub start: u64,
    pub len: usize,
    pub value: T,
}

impl<T> Entry<T> {
    /// Byte offset of `ptr` in this allocation (the caller found it with `find`).
    pub fn offset_of(&self, ptr: u64) -> usize {
        (ptr - self.start) as usize
    }
}

/// Allocations by start address.
#[derive(Debug)]
pub struct AddressIndex<T> {
    by_start: BTreeMap<u64, Entry<T>>,
}

impl<T> Default for AddressIndex<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> AddressIndex<T> {
    pub const fn new() -> Self {
        Self { by_start: BTreeMap::new() }
    }

    /// Enters an allocation; `false` (and nothing changes) if it would overlap one already there.
    pub fn insert(&mut self, start: u64, len: usize, value: T) -> bool {
        let end = start.saturating_add(len as u64);
        let overlaps_before = self.find(start).is_some();
        let overlaps_after = self.by_start.range(start..end).next().is_some();
        if len == 0 || overlaps_before || overlaps_after {
            return false;
        }
        self.by_start.insert(start, Entry { start, len, value });
        true
    }

    /// The allocation containing `ptr`.
    pub fn find(&self, ptr: u64) -> Option<&Entry<T>> {
        let (_, entry) = self.by_start.range(..=ptr).next_back()?;
        (ptr - entry.start < entry.len as u64).then_some(entry)
    }

    /// The allocation starting exactly at `start` (frees take only start addresses).
    pub fn get(&self, start: u64) -> Option<&Entry<T>> {
        self.by_start.get(&start)
    }

    pub fn remove(&mut self, start: u64) -> Option<Entry<T>> {
        self.by_start.remove(&start)
    }

    pub fn len(&self) -> usize {
        self.by_start.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_start.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pointer_finds_the_allocation_it_falls_in() {
        let mut index = AddressIndex::new();
        assert!(index.insert(0x1000, 0x100, 'a'));
        assert!(index.insert(0x2000, 0x10, 'b'));
        assert_eq!(index.find(0x1000).map(|e| e.value), Some('a'));
        assert_eq!(index.find(0x10ff).map(|e| (e.value, e.offset_of(0x10ff))), Some(('a', 0xff)));
        assert_eq!(index.find(0x1100), None, "one past the end is outside");
        assert_eq!(index.find(0xfff), None);
        assert_eq!(index.find(0x200f).map(|e| e.value), Some('b'));
        assert_eq!(index.find(u64::MAX), None);
        assert_eq!(index.get(0x1001), None, "get takes start addresses only");
    }

    #[test]
    fn overlapping_or_empty_allocations_are_refused() {
        let mut index = AddressIndex::new();
        assert!(index.insert(0x1000, 0x100, 1));
        assert!(!index.insert(0x10ff, 1, 2), "starts inside");
        assert!(!index.insert(0xf00, 0x101, 3), "ends inside");
        assert!(!index.insert(0xf00, 0x1000, 4), "covers it");
        assert!(!index.insert(0x3000, 0, 5), "empty");
        assert!(index.insert(0x1100, 1, 6), "adjacent is fine");
        assert_eq!(index.len(), 2);
        assert_eq!(index.remove(0x1000).map(|e| e.value), Some(1));
        assert_eq!(index.find(0x1000), None);
        assert!(!index.is_empty());
    }
}
