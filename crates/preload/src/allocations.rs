//! The bookkeeping of interposed allocations: device pointer → allocation, and the managed
//! allocations that pass through to the driver but are counted.
//!
//! `cuMemFree` takes exactly the pointer the allocation returned, so lookups are by base
//! pointer. Not thread-safe by itself: the process state (process.rs) owns it behind its lock.

use std::collections::BTreeMap;

use tiermem_mechanism::PhysHandle;

use crate::placement::Tier;

/// One interposed allocation: a reservation with its chunks mapped in order, each `chunk`
/// bytes but the last, which holds what is left (process.rs: a chunk is the unit that moves).
#[derive(Debug)]
pub struct Allocation {
    /// The reservation's start: the pointer the program got.
    pub va: u64,
    /// Bytes reserved and mapped: the request rounded up to the driver's granularity.
    pub reserved: usize,
    /// Bytes the program asked for (what the driver reports as the allocation's size).
    pub requested: usize,
    /// The GPU whose context made it.
    pub ordinal: usize,
    /// Bytes of every chunk but the last.
    pub chunk: usize,
    /// The physical chunks, mapped one after the other from `va`, and where each lives.
    pub chunks: Vec<(PhysHandle, Tier)>,
    /// Shared with other processes (a legacy IPC handle, ipc.rs): its chunks never move again,
    /// since other processes map them.
    pub shared: bool,
}

impl Allocation {
    /// Where chunk `index` is mapped.
    pub fn chunk_va(&self, index: usize) -> u64 {
        self.va + (index * self.chunk) as u64
    }

    /// Bytes of chunk `index`: a whole chunk, or what is left of the reservation.
    pub fn chunk_len(&self, index: usize) -> usize {
        self.chunk.min(self.reserved.saturating_sub(index * self.chunk))
    }

    /// Bytes of this allocation on `tier`.
    pub fn bytes_on(&self, tier: Tier) -> usize {
        self.chunks.iter().enumerate().filter(|(_, (_, t))| *t == tier).map(|(i, _)| self.chunk_len(i)).sum()
    }
}

/// Every live interposed allocation, the freed ones kept mapped for a reuse (deferred.rs), and
/// the managed ones.
#[derive(Debug, Default)]
pub struct Allocations {
    by_va: BTreeMap<u64, Allocation>,
    /// Freed in stream order and kept mapped until reused or given back: out of the program's
    /// view (no lookup by pointer finds them), but their chunks may move (cycle.rs plans them).
    kept: BTreeMap<u64, Allocation>,
    /// `cuMemAllocManaged` pointers and their sizes: passed through, counted, never moved.
    managed: BTreeMap<u64, usize>,
    /// Small allocations left to the driver (placement.rs): pointer → (GPU, bytes counted).
    small: BTreeMap<u64, (usize, usize)>,
    /// Bytes reserved by the kept allocations, per GPU (pool_stats.rs).
    kept_bytes: BTreeMap<usize, usize>,
}

impl Allocations {
    pub const fn new() -> Self {
        Self {
            by_va: BTreeMap::new(),
            kept: BTreeMap::new(),
            managed: BTreeMap::new(),
            small: BTreeMap::new(),
            kept_bytes: BTreeMap::new(),
        }
    }

    pub fn insert(&mut self, allocation: Allocation) {
        self.by_va.insert(allocation.va, allocation);
    }

    /// Takes the allocation starting at `ptr` out of the books: none if `ptr` is not the start
    /// of a live interposed allocation (a pointer of the driver's, or one freed already).
    pub fn remove(&mut self, ptr: u64) -> Option<Allocation> {
        self.by_va.remove(&ptr)
    }

    /// The allocation starting at `va`, to change where its chunks are (migrate.rs).
    pub fn get_mut(&mut self, va: u64) -> Option<&mut Allocation> {
        self.by_va.get_mut(&va)
    }

    /// The allocation holding the address `ptr`, anywhere in it.
    pub fn containing(&self, ptr: u64) -> Option<&Allocation> {
        let (_, allocation) = self.by_va.range(..=ptr).next_back()?;
        (ptr < allocation.va + allocation.reserved as u64).then_some(allocation)
    }

    /// As [`Allocations::containing`], to change it.
    pub fn containing_mut(&mut self, ptr: u64) -> Option<&mut Allocation> {
        let (_, allocation) = self.by_va.range_mut(..=ptr).next_back()?;
        (ptr < allocation.va + allocation.reserved as u64).then_some(allocation)
    }

    /// Every live interposed allocation, by address.
    pub fn iter(&self) -> impl Iterator<Item = &Allocation> {
        self.by_va.values()
    }

    /// Keeps a freed allocation mapped (deferred.rs) until [`Allocations::take_kept`].
    pub fn keep(&mut self, allocation: Allocation) {
        *self.kept_bytes.entry(allocation.ordinal).or_default() += allocation.reserved;
        self.kept.insert(allocation.va, allocation);
    }

    /// The kept allocation starting at `va`, taken out: reused, or to be torn down.
    pub fn take_kept(&mut self, va: u64) -> Option<Allocation> {
        let taken = self.kept.remove(&va)?;
        if let Some(bytes) = self.kept_bytes.get_mut(&taken.ordinal) {
            *bytes = bytes.saturating_sub(taken.reserved);
        }
        Some(taken)
    }

    /// Bytes the kept allocations of GPU `ordinal` reserve.
    pub fn kept_bytes(&self, ordinal: usize) -> usize {
        self.kept_bytes.get(&ordinal).copied().unwrap_or(0)
    }

    /// Every kept allocation, by address.
    pub fn kept(&self) -> impl Iterator<Item = &Allocation> {
        self.kept.values()
    }

    /// The live or kept allocation starting at `va`: what a move may find its chunk in.
    pub fn movable(&self, va: u64) -> Option<&Allocation> {
        self.by_va.get(&va).or_else(|| self.kept.get(&va))
    }

    /// As [`Allocations::movable`], to change where its chunks are, and whether it is live.
    pub fn movable_mut(&mut self, va: u64) -> Option<(&mut Allocation, bool)> {
        match self.by_va.get_mut(&va) {
            Some(live) => Some((live, true)),
            None => self.kept.get_mut(&va).map(|kept| (kept, false)),
        }
    }

    pub fn insert_small(&mut self, ptr: u64, ordinal: usize, bytes: usize) {
        self.small.insert(ptr, (ordinal, bytes));
    }

    /// The GPU and counted bytes of the small allocation at `ptr`, taken out of the books.
    pub fn remove_small(&mut self, ptr: u64) -> Option<(usize, usize)> {
        self.small.remove(&ptr)
    }

    /// Takes every small allocation of GPU `ordinal` out of the books (a reset freed them);
    /// the bytes they counted.
    pub fn take_small_of(&mut self, ordinal: usize) -> usize {
        let mut bytes = 0;
        self.small.retain(|_, &mut (gpu, counted)| {
            let theirs = gpu == ordinal;
            bytes += if theirs { counted } else { 0 };
            !theirs
        });
        bytes
    }

    pub fn insert_managed(&mut self, ptr: u64, size: usize) {
        self.managed.insert(ptr, size);
    }

    /// The size of the managed allocation at `ptr`, taken out of the books.
    pub fn remove_managed(&mut self, ptr: u64) -> Option<usize> {
        self.managed.remove(&ptr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allocation(va: u64, tiers: &[Tier]) -> Allocation {
        let chunks = tiers.iter().enumerate().map(|(i, &t)| (PhysHandle(i as u64), t)).collect();
        let reserved = (tiers.len() << 21) - (1 << 20);
        Allocation { va, reserved, requested: reserved, ordinal: 0, chunk: 2 << 20, chunks, shared: false }
    }

    #[test]
    fn an_allocation_is_found_once_by_its_start_only() {
        let mut books = Allocations::default();
        books.insert(allocation(0x10_0000_0000, &[Tier::Hbm, Tier::Host]));
        assert!(books.remove(0x10_0000_0001).is_none(), "an inner pointer is not an allocation");
        let inner = books.containing_mut(0x10_002f_ffff).map(|a| a.va);
        assert_eq!(inner, Some(0x10_0000_0000), "but it is in one");
        assert!(books.containing_mut(0x10_0030_0000).is_none(), "the end is not in it");
        assert!(books.containing_mut(0x0f_ffff_ffff).is_none(), "nor is what comes before");
        let a = books.remove(0x10_0000_0000).expect("the allocation");
        assert_eq!((a.bytes_on(Tier::Hbm), a.bytes_on(Tier::Host)), (2 << 20, 1 << 20), "the last chunk is short");
        assert_eq!((a.chunk_va(1), a.chunk_len(0), a.chunk_len(1)), (0x10_0020_0000, 2 << 20, 1 << 20));
        assert!(books.remove(0x10_0000_0000).is_none(), "a second free finds nothing");
    }

    #[test]
    fn a_kept_allocation_is_out_of_the_programs_view_but_movable() {
        let mut books = Allocations::default();
        books.insert(allocation(0x20_0000_0000, &[Tier::Hbm]));
        let freed = books.remove(0x20_0000_0000).expect("live");
        books.keep(freed);
        assert!(books.containing(0x20_0000_0000).is_none() && books.containing(0x20_0000_0001).is_none());
        assert!(books.remove(0x20_0000_0000).is_none(), "a second free finds nothing");
        assert_eq!(books.movable_mut(0x20_0000_0000).map(|(a, live)| (a.va, live)), Some((0x20_0000_0000, false)));
        assert_eq!(books.kept().count(), 1);
        let reused = books.take_kept(0x20_0000_0000).expect("kept");
        books.insert(reused);
        assert_eq!(books.movable_mut(0x20_0000_0000).map(|(_, live)| live), Some(true));
        assert!(books.take_kept(0x20_0000_0000).is_none());
    }

    #[test]
    fn managed_allocations_are_counted_apart() {
        let mut books = Allocations::default();
        books.insert_managed(0x7000, 100);
        assert!(books.remove(0x7000).is_none());
        assert_eq!(books.remove_managed(0x7000), Some(100));
        assert_eq!(books.remove_managed(0x7000), None);
    }
}
