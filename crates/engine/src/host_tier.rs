//! The host tier: pinned host memory cut into chunk-sized slots.
//!
//! Pinning is slow (hundreds of ms per GiB), so memory is pinned in slabs on first need, up
//! to the host cap, and kept. A page-out of n chunks asks for n slots and gets a contiguous
//! run when one is free, so that adjacent chunks travel in one copy.

use std::collections::{BTreeSet, HashMap};
use tiermem_mechanism::{Device, HostPtr, Result};

/// Index of one chunk-sized slot of pinned host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Slot(pub u32);

pub(crate) struct HostTier {
    chunk: usize,
    slab_slots: usize,
    cap_slots: usize,
    slabs: Vec<HostPtr>,
    free: BTreeSet<Slot>,
    /// Slots a background file write is reading: `free` leaves them taken until `unhold`
    /// (`true`: freed meanwhile, to be freed then).
    held: HashMap<Slot, bool>,
}

impl HostTier {
    pub fn new(chunk: usize, cap_bytes: usize) -> Self {
        // Slabs of up to 1 GiB (at 2 MiB chunks); the cap is rounded down to whole slabs.
        let slab_slots = (cap_bytes / chunk).clamp(1, 512);
        let cap_slots = cap_bytes / chunk / slab_slots * slab_slots;
        Self { chunk, slab_slots, cap_slots, slabs: Vec::new(), free: BTreeSet::new(), held: HashMap::new() }
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
        while self.free.len() < n {
            let base = self.slabs.len() * self.slab_slots;
            if base >= self.cap_slots {
                return Ok(None);
            }
            self.slabs.push(device.alloc_pinned(self.slab_slots * self.chunk)?);
            self.free.extend((base..base + self.slab_slots).map(|i| Slot(i as u32)));
        }
        let run = self.find_run(n).unwrap_or_else(|| self.free.iter().take(n).copied().collect());
        for slot in &run {
            self.free.remove(slot);
        }
        Ok(Some(run))
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
