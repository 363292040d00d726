//! The host tier: pinned host memory cut into chunk-sized slots.
//!
//! Pinning is slow (hundreds of ms per GiB), so memory is pinned in slabs on first need, up
//! to the host cap, and kept — until a budget (the node daemon's share of the host's pinned
//! memory, `Engine::set_host_budget`) falls below what is pinned: then slots beyond it are
//! refused, and wholly free slabs at the end are unpinned. A page-out of n chunks asks for n
//! slots and gets a contiguous run when one is free, so that adjacent chunks travel in one copy.

use std::collections::{BTreeSet, HashMap};
use tiermem_mechanism::{Device, HostPtr, Result};

/// The most pinned at once: pinning takes hundreds of ms per GiB.
const SLAB_BYTES: usize = 1 << 30;

/// Index of one chunk-sized slot of pinned host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Slot(pub u32);

pub(crate) struct HostTier {
    chunk: usize,
    slab_slots: usize,
    /// The most it ever pins (the configured cap, whole slabs).
    most_slots: usize,
    /// The most in use: `most_slots`, or less while a budget says so (`set_budget`).
    cap_slots: usize,
    slabs: Vec<HostPtr>,
    free: BTreeSet<Slot>,
    /// Slots a background file write is reading: `free` leaves them taken until `unhold`
    /// (`true`: freed meanwhile, to be freed then).
    held: HashMap<Slot, bool>,
    /// Whether slabs may be pinned ahead of need (evict_room.rs); off after pinning failed.
    pin_ahead: bool,
}

impl HostTier {
    pub fn new(chunk: usize, cap_bytes: usize) -> Self {
        // Slabs of up to 512 slots and 1 GiB (or one chunk, if larger); the cap is rounded
        // down to whole slabs.
        let slab_slots = (cap_bytes / chunk).clamp(1, (SLAB_BYTES / chunk).clamp(1, 512));
        let most_slots = cap_bytes / chunk / slab_slots * slab_slots;
        Self {
            chunk,
            slab_slots,
            most_slots,
            cap_slots: most_slots,
            slabs: Vec::new(),
            free: BTreeSet::new(),
            held: HashMap::new(),
            pin_ahead: false,
        }
    }

    /// The tier with pinning ahead of need allowed (`on`) or not.
    pub fn pinning_ahead(self, on: bool) -> Self {
        Self { pin_ahead: on, ..self }
    }

    /// Stops pinning ahead of need (after it failed: the host is short of memory to pin).
    pub fn stop_pinning_ahead(&mut self) {
        self.pin_ahead = false;
    }

    /// At most `slots` in use from now on (never more than the configured cap): allocations
    /// beyond it are refused, as beyond the cap. Slots in use stay; the caller moves them.
    pub fn set_budget(&mut self, slots: usize) {
        self.cap_slots = slots.min(self.most_slots);
    }

    /// Slots in use beyond the budget.
    pub fn excess(&self) -> usize {
        self.in_use().saturating_sub(self.cap_slots)
    }

    /// Unpins the last slabs while they are wholly free and more is pinned than the budget
    /// allows; returns the bytes unpinned. (A free slab before one in use stays pinned: slots
    /// are numbered through the slabs.)
    pub fn unpin_spare(&mut self, device: &dyn Device) -> Result<usize> {
        let mut unpinned = 0;
        while self.slabs.len() * self.slab_slots > self.cap_slots {
            let base = (self.slabs.len() - 1) * self.slab_slots;
            let slots = (base..base + self.slab_slots).map(|i| Slot(i as u32));
            if slots.clone().any(|slot| !self.free.contains(&slot)) {
                break;
            }
            let ptr = *self.slabs.last().expect("a slab");
            device.free_pinned(ptr, self.slab_slots * self.chunk)?;
            self.slabs.pop();
            for slot in slots {
                self.free.remove(&slot);
            }
            unpinned += self.slab_slots * self.chunk;
        }
        Ok(unpinned)
    }

    pub fn cap(&self) -> usize {
        self.cap_slots
    }

    pub fn in_use(&self) -> usize {
        self.slabs.len() * self.slab_slots - self.free.len()
    }

    pub fn pinned_bytes(&self) -> usize {
        self.slabs.len() * self.slab_slots * self.chunk
    }

    pub fn addr(&self, slot: Slot) -> HostPtr {
        let i = slot.0 as usize;
        self.slabs[i / self.slab_slots] + (i % self.slab_slots) * self.chunk
    }

    /// The pinned allocation (slab) `slot` is in: one copy never spans two of them, even where
    /// the driver placed them next to each other (`cuMemcpy*Async` refuses such a range with
    /// `CUDA_ERROR_INVALID_VALUE`).
    pub fn slab(&self, slot: Slot) -> usize {
        slot.0 as usize / self.slab_slots
    }

    /// `n` slots, contiguous where possible; `None` (and nothing taken) if the cap forbids.
    pub fn alloc(&mut self, device: &dyn Device, n: usize) -> Result<Option<Vec<Slot>>> {
        if self.in_use() + n > self.cap_slots {
            return Ok(None);
        }
        while self.free.len() < n {
            if self.slabs.len() * self.slab_slots >= self.most_slots {
                return Ok(None);
            }
            self.push_slab(device.alloc_pinned(self.slab_bytes())?);
        }
        let run = self.find_run(n).unwrap_or_else(|| self.free.iter().take(n).copied().collect());
        for slot in &run {
            self.free.remove(slot);
        }
        Ok(Some(run))
    }

    /// The bytes of one slab: what [`HostTier::adopt_slab`] takes.
    pub fn slab_bytes(&self) -> usize {
        self.slab_slots * self.chunk
    }

    /// Whether pinning ahead is on, fewer than `room` slots are free and the budget allows
    /// another slab: then one pinned ahead of need ([`HostTier::adopt_slab`]) saves an
    /// eviction from pinning it.
    pub fn short_of(&self, room: usize) -> bool {
        self.pin_ahead && self.free.len() < room && self.another_slab_fits()
    }

    /// Whether the budget allows one more slab pinned.
    fn another_slab_fits(&self) -> bool {
        (self.slabs.len() + 1) * self.slab_slots <= self.cap_slots
    }

    /// Takes a slab of [`HostTier::slab_bytes`] pinned with no lock held; `false` (the caller
    /// unpins it) if the budget no longer allows it.
    pub fn adopt_slab(&mut self, base: HostPtr) -> bool {
        let fits = self.another_slab_fits();
        if fits {
            self.push_slab(base);
        }
        fits
    }

    fn push_slab(&mut self, base: HostPtr) {
        let first = self.slabs.len() * self.slab_slots;
        self.slabs.push(base);
        self.free.extend((first..first + self.slab_slots).map(|i| Slot(i as u32)));
    }

    /// The first run of `n` consecutive free slots inside one slab.
    fn find_run(&self, n: usize) -> Option<Vec<Slot>> {
        let start = crate::slot_runs::first_free_run(self.free.iter().map(|s| s.0), n, self.slab_slots as u32)?;
        Some((start..start + n as u32).map(Slot).collect())
    }

    pub fn free(&mut self, slot: Slot) {
        if let Some(freed) = self.held.get_mut(&slot) {
            debug_assert!(!*freed, "host slot {slot:?} freed twice");
            *freed = true;
            return;
        }
        let fresh = self.free.insert(slot);
        debug_assert!(fresh, "host slot {slot:?} freed twice");
    }

    /// Keeps `slot` from being reused until [`HostTier::unhold`], even if it is freed.
    pub fn hold(&mut self, slot: Slot) {
        let fresh = self.held.insert(slot, false).is_none();
        debug_assert!(fresh, "host slot {slot:?} held twice");
    }

    /// Ends a [`HostTier::hold`]; a slot freed meanwhile is freed now.
    pub fn unhold(&mut self, slot: Slot) {
        if self.held.remove(&slot) == Some(true) {
            self.free(slot);
        }
    }

    /// Whether a background write holds `slot`.
    pub fn is_held(&self, slot: Slot) -> bool {
        self.held.contains_key(&slot)
    }

    /// Whether any slot was freed while held: it comes back when its write is committed.
    pub fn has_freed_while_held(&self) -> bool {
        self.freed_while_held_count() > 0
    }

    /// How many slots were freed while held.
    pub fn freed_while_held_count(&self) -> usize {
        self.held.values().filter(|&&freed| freed).count()
    }

    /// Whether `slot` was freed while held (its chunk no longer owns it).
    pub fn freed_while_held(&self, slot: Slot) -> bool {
        self.held.get(&slot) == Some(&true)
    }

    /// Unpins every slab; the engine calls this once no slot is in use.
    pub fn release_all(&mut self, device: &dyn Device) -> Result<()> {
        for base in self.slabs.drain(..) {
            device.free_pinned(base, self.slab_slots * self.chunk)?;
        }
        self.free.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiermem_mechanism::sim::SimDevice;

    /// Slots of 4 KiB: slabs of 512 slots (2 MiB), so three slabs fit a small test.
    #[test]
    fn a_budget_refuses_slots_beyond_it_and_unpins_wholly_free_slabs_at_the_end() {
        const SLOT: usize = 4096;
        let device = SimDevice::new(8 << 20).unwrap();
        let mut host = HostTier::new(SLOT, 3 * 512 * SLOT);
        let first = host.alloc(&device, 600).unwrap().unwrap();
        let last = host.alloc(&device, 500).unwrap().unwrap();
        assert_eq!((host.in_use(), host.pinned_bytes()), (1100, 3 * 512 * SLOT));
        host.set_budget(700);
        assert_eq!(host.excess(), 400);
        assert!(host.alloc(&device, 1).unwrap().is_none(), "beyond the budget: refused");
        assert_eq!(host.unpin_spare(&device).unwrap(), 0, "the last slab is in use");
        last.into_iter().for_each(|slot| host.free(slot));
        assert_eq!(host.unpin_spare(&device).unwrap(), 512 * SLOT, "the third slab goes; the second is in use");
        assert_eq!(device.live().pinned_bytes, 2 * 512 * SLOT);
        host.set_budget(usize::MAX);
        assert_eq!(host.cap(), 3 * 512, "never beyond the configured cap");
        let again = host.alloc(&device, 900).unwrap().expect("room again, pinned anew");
        assert_eq!(host.pinned_bytes(), 3 * 512 * SLOT);
        first.into_iter().chain(again).for_each(|slot| host.free(slot));
        host.release_all(&device).unwrap();
        assert_eq!(device.live().pinned_bytes, 0);
    }
}
