//! The peer tier: spare HBM lent by neighbour GPUs (memHarvester's harvested memory), cut into
//! chunk-sized slots that chunks leaving this GPU's HBM are copied into over NVLink.
//!
//! Memory is borrowed in *slabs*: one physical allocation of 32 chunks made on one lender
//! (`cuMemCreate` at that GPU's location), mapped into a VA range this engine reserves, with
//! access from this GPU set once for the whole range (`cuMemSetAccess` costs
//! ~31 µs a call; forgetting it makes NVLink accesses fault). A slot's address is then an
//! ordinary device address: copies between it and a chunk of a buffer are device-to-device
//! copies run by this GPU, at NVLink speed. Slabs are made on first need, round-robin among
//! the lenders that still have room, up to what each lends (its *cap*).
//!
//! **Giving memory back.** A lender's memory returns to it only when every mapping of it is
//! gone, so a slab is the unit of return: lowering a lender's cap marks its emptiest slabs
//! *draining* (their free slots are never handed out again); the engine moves the chunks
//! still in them elsewhere (placement.rs, "reclaim"), and a draining slab with no slot in
//! use is unmapped and its handle released: one `cuMemUnmap`, one `cuMemRelease`.
//!
//! On the H200 the driver unmaps at ~33 µs per mapping, so slabs of 32 separately mapped chunks
//! made a lender wait 15–17 ms per GiB. A slab that cannot be created (the lender ran out of
//! memory meanwhile) caps that lender where it stands: the engine falls back to the host tier.
//!
//! **Mapped in place.** To read a chunk where it lies (movement.rs, "Reading in place"), its slot is mapped at the
//! chunk's own address too. The driver maps only whole allocations (`cuMemMap` takes an
//! offset that "must currently be zero"; a part of a 64 MiB allocation is refused with
//! `CUDA_ERROR_NOT_SUPPORTED` on the H200), so with `TIERMEM_PEER_IN_PLACE` slabs are made of
//! one allocation per slot ([`PeerTier::part`]), and giving one back costs an unmap per slot.
//! Mappings in place are undone before their chunk gives its slot up, so a slab with no slot
//! in use has no mapping but its own.
//!
//! **A busy lender** takes new chunks only as fast as its traffic budget allows
//! (peer_traffic.rs): [`PeerTier::alloc_up_to`] hands out its slots while the budget holds
//! them, fewer (maybe none) beyond.
//!
//! Nothing here decides which chunk goes where: that is `policy::leave_hbm` and the engine's
//! planning. This is bookkeeping over driver calls.

use crate::peer_traffic::LenderTraffic;
use std::collections::BTreeSet;
use tiermem_mechanism::{ChunkLocation, Device, DevicePtr, PhysHandle, Result};

/// Index of one chunk-sized slot of borrowed HBM: slab `index / slab_chunks`, chunk
/// `index % slab_chunks` of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct PeerSlot(pub u32);

/// The most bytes in one slab (whole chunks): small enough to give back in steps, large
/// enough that one `cuMemSetAccess` covers many chunks.
const SLAB_BYTES: usize = 64 << 20;

/// A neighbour GPU that lends memory.
#[derive(Debug, Clone)]
pub(crate) struct Lender {
    pub gpu: usize,
    /// The most slabs it lends now.
    cap_slabs: usize,
    /// Slabs made on it and not yet released.
    live_slabs: usize,
    /// Why the last slab could not be made there, if one could not.
    pub refused: Option<String>,
    /// The most it lends: what it could spare when the engine started, or what
    /// [`PeerTier::set_most`] said since. The lender watch never raises its cap above it.
    pub most: usize,
    /// What it could spare when the engine started: the most a budget gives it back.
    pub offered: usize,
}

struct Slab {
    lender: usize,
    /// Lent by another process (peer_lent.rs): the daemon's id for it. Such a slab is not the
    /// engine's to make or cap; it goes back when asked, or when its lender lowers what it lends.
    lent: Option<u64>,
    va: DevicePtr,
    /// Its allocations: one for the slab, or one per slot where slots are read in place.
    handles: Vec<PhysHandle>,
    used: usize,
    draining: bool,
}

pub(crate) struct PeerTier {
    chunk: usize,
    slab_chunks: usize,
    /// This GPU: the one given access to every slab.
    me: usize,
    lenders: Vec<Lender>,
    /// By slab index; a released slab leaves `None` (slot numbers stay stable).
    slabs: Vec<Option<Slab>>,
    free: BTreeSet<PeerSlot>,
    next_lender: usize,
    /// Slabs made from here on have one allocation per slot, so that a slot can be mapped at
    /// its chunk's address ([`PeerTier::part`]).
    in_place: bool,
    traffic: LenderTraffic,
    /// Lent slabs given back and not yet reported (peer_lent.rs).
    returned_lent: Vec<u64>,
}

impl PeerTier {
    /// A tier borrowing from `lenders` (GPU ordinal, bytes it may lend) for GPU `me`.
    pub fn new(chunk: usize, me: usize, lenders: &[(usize, usize)]) -> Self {
        // Without lenders of its own, slabs lent by other processes are whole slabs.
        let most = (SLAB_BYTES / chunk).max(1);
        let smallest = lenders.iter().map(|&(_, bytes)| bytes / chunk).filter(|&c| c > 0).min().unwrap_or(most);
        let slab_chunks = smallest.clamp(1, most);
        let traffic = LenderTraffic::new(lenders.len(), None, chunk);
        let lenders = lenders
            .iter()
            .map(|&(gpu, bytes)| Lender {
                gpu,
                cap_slabs: bytes / chunk / slab_chunks,
                live_slabs: 0,
                refused: None,
                most: bytes,
                offered: bytes,
            })
            .collect();
        Self {
            chunk,
            slab_chunks,
            me,
            lenders,
            slabs: Vec::new(),
            free: BTreeSet::new(),
            next_lender: 0,
            in_place: false,
            traffic,
            returned_lent: Vec::new(),
        }
    }

    /// While a lender's own work runs, its traffic is held to `rate` bytes per second
    /// (peer_traffic.rs); `None`: never held.
    pub fn with_busy_rate(mut self, rate: Option<usize>) -> Self {
        self.traffic = LenderTraffic::new(self.lenders.len(), rate, self.chunk);
        self
    }

    /// GPU `gpu`'s own kernels run now (`busy`), or not: its traffic is held, or not.
    pub fn set_busy(&mut self, gpu: usize, busy: bool) {
        if let Some(lender) = self.lenders.iter().position(|l| l.gpu == gpu) {
            self.traffic.set_busy(lender, busy);
        }
    }

    /// Whether GPU `gpu` lends and its traffic is held now.
    pub fn is_busy(&self, gpu: usize) -> bool {
        self.lenders.iter().position(|l| l.gpu == gpu).is_some_and(|lender| self.traffic.busy(lender))
    }

    /// Counts `bytes` read from slab `slab` (a page-in: it had to move).
    pub fn charge_slab(&mut self, slab: usize, bytes: usize) {
        if let Some(slab) = &self.slabs[slab] {
            self.traffic.charge(slab.lender, bytes);
        }
    }

    /// Whether `slot`'s chunk may be read now for work that can wait (cleaning); if so, it is
    /// counted.
    pub fn may_read(&mut self, slot: PeerSlot) -> bool {
        let lender = self.lender_of(slot);
        let yes = self.traffic.room(lender, self.chunk, 1) == 1;
        if yes {
            self.traffic.charge(lender, self.chunk);
        }
        yes
    }

    fn lender_of(&self, slot: PeerSlot) -> usize {
        self.slabs[self.split(slot).0].as_ref().expect("a slot of a live slab").lender
    }

    /// Slabs to be made with one allocation per slot, so that chunks can be read in place
    /// (`TIERMEM_PEER_IN_PLACE`): the driver maps only whole allocations.
    pub fn with_slots_readable_in_place(mut self, yes: bool) -> Self {
        self.in_place = yes;
        self
    }

    pub fn lenders(&self) -> &[Lender] {
        &self.lenders
    }

    /// What lender `lender` lends now, in bytes (whole slabs).
    pub fn cap_of(&self, lender: &Lender) -> usize {
        lender.cap_slabs * self.slab_chunks * self.chunk
    }

    /// Whether any GPU lends to this one.
    pub fn exists(&self) -> bool {
        !self.lenders.is_empty()
    }

    /// The most slots all lenders lend now (slabs lent by other processes included).
    pub fn cap(&self) -> usize {
        let lent = self.live().filter(|s| s.lent.is_some() && !s.draining).count();
        (self.lenders.iter().map(|l| l.cap_slabs).sum::<usize>() + lent) * self.slab_chunks
    }

    /// Bytes of one slab: lenders lend whole slabs.
    pub fn slab_bytes(&self) -> usize {
        self.slab_chunks * self.chunk
    }

    /// Slots made and free (a chunk can go there without a slab being made).
    pub fn free_slots(&self) -> usize {
        self.free.len()
    }

    /// Slots holding chunks' bytes.
    pub fn in_use(&self) -> usize {
        self.live().map(|s| s.used).sum()
    }

    /// Bytes borrowed from GPU `gpu` now.
    pub fn borrowed_from(&self, gpu: usize) -> usize {
        self.lenders.iter().find(|l| l.gpu == gpu).map_or(0, |l| l.live_slabs * self.slab_chunks * self.chunk)
    }

    fn live(&self) -> impl Iterator<Item = &Slab> {
        self.slabs.iter().flatten()
    }

    pub fn addr(&self, slot: PeerSlot) -> DevicePtr {
        let (slab, i) = self.split(slot);
        self.slabs[slab].as_ref().expect("a slot of a live slab").va + (i * self.chunk) as u64
    }

    /// The allocation that is `slot`, to map it in place; `None` if its slab is one allocation
    /// of several slots.
    pub fn part(&self, slot: PeerSlot) -> Option<PhysHandle> {
        let (slab, i) = self.split(slot);
        let handles = &self.slabs[slab].as_ref().expect("a slot of a live slab").handles;
        (handles.len() == self.slab_chunks).then(|| handles[i])
    }

    /// Whether slabs are made so that their slots can be read in place.
    pub fn readable_in_place(&self) -> bool {
        self.in_place || self.slab_chunks == 1
    }

    /// The slab `slot` is in: copies never span two (they are separate reservations).
    pub fn slab(&self, slot: PeerSlot) -> usize {
        self.split(slot).0
    }

    fn split(&self, slot: PeerSlot) -> (usize, usize) {
        (slot.0 as usize / self.slab_chunks, slot.0 as usize % self.slab_chunks)
    }

    /// Up to `n` slots, contiguous where possible, making slabs on lenders with room. Fewer
    /// (maybe none) when the lenders lend no more, or a busy lender's traffic is held. A lender
    /// whose slab cannot be made is capped where it stands (the reason kept in
    /// [`Lender::refused`]) and the others are tried.
    pub fn alloc_up_to(&mut self, device: &dyn Device, n: usize) -> Vec<PeerSlot> {
        if self.traffic.any_busy() {
            return self.alloc_held(device, n);
        }
        while self.free.len() < n {
            let Some(lender) = self.lender_with_room(|_| true) else { break };
            self.grow_or_cap(device, lender);
        }
        let run = self.find_run(n, |_| true).unwrap_or_else(|| self.free.iter().take(n).copied().collect());
        self.hand_out(&run);
        run
    }

    /// As `alloc_up_to` while some lender is busy: each lender gives at most what its
    /// traffic budget holds now.
    fn alloc_held(&mut self, device: &dyn Device, n: usize) -> Vec<PeerSlot> {
        let mut room: Vec<usize> = (0..self.lenders.len()).map(|l| self.traffic.room(l, self.chunk, n)).collect();
        loop {
            let open = self.free.iter().filter(|&&s| room[self.lender_of(s)] > 0).take(n).count();
            if open >= n {
                break;
            }
            let Some(lender) = self.lender_with_room(|l| room[l] > 0) else { break };
            self.grow_or_cap(device, lender);
        }
        let run = self.find_run(n, |lender| room[lender] >= n).unwrap_or_else(|| {
            let mut run = Vec::new();
            for &slot in self.free.iter() {
                let lender = self.lender_of(slot);
                if run.len() < n && room[lender] > 0 {
                    room[lender] -= 1;
                    run.push(slot);
                }
            }
            run
        });
        for &slot in &run {
            self.traffic.charge(self.lender_of(slot), self.chunk);
        }
        self.hand_out(&run);
        run
    }

    /// Makes a slab on `lender`, or caps it where it stands if it cannot: the host tier
    /// takes the rest.
    fn grow_or_cap(&mut self, device: &dyn Device, lender: usize) {
        if let Err(e) = self.grow(device, lender) {
            let l = &mut self.lenders[lender];
            l.cap_slabs = l.live_slabs;
            l.refused = Some(e.to_string());
        }
    }

    /// Marks `run` in use.
    fn hand_out(&mut self, run: &[PeerSlot]) {
        for slot in run {
            self.free.remove(slot);
            let (slab, _) = self.split(*slot);
            self.slabs[slab].as_mut().expect("a free slot of a live slab").used += 1;
        }
    }

    /// The next lender, round-robin, that lends more than it has lent and is `open`.
    fn lender_with_room(&mut self, open: impl Fn(usize) -> bool) -> Option<usize> {
        let count = self.lenders.len();
        (0..count)
            .map(|k| (self.next_lender + k) % count)
            .find(|&i| self.lenders[i].live_slabs < self.lenders[i].cap_slabs && open(i))
            .inspect(|&i| self.next_lender = (i + 1) % count)
    }

    /// Makes one slab on `lender`: chunks created there, mapped into a fresh range, access
    /// for this GPU set once. On failure everything made is undone.
    fn grow(&mut self, device: &dyn Device, lender: usize) -> Result<()> {
        let size = self.slab_chunks * self.chunk;
        let va = device.reserve(size)?;
        // Rolls back: `handles` mapped (in place: one granule each; else the whole range).
        let undo = |handles: &[PhysHandle]| {
            let _ = self.unmap_slab(device, va, handles.len());
            for &handle in handles {
                let _ = device.release_mapped_chunk(handle);
            }
            let _ = device.unreserve(va, size);
        };
        let location = ChunkLocation::Gpu(self.lenders[lender].gpu);
        let mut handles = Vec::new();
        if self.in_place {
            // One allocation per slot: a slot maps elsewhere only as a whole allocation.
            for i in 0..self.slab_chunks {
                let handle = device.create_chunk_at(location).inspect_err(|_| undo(&handles))?;
                device.map(va + (i * self.chunk) as u64, handle).inspect_err(|_| {
                    let _ = device.release_chunk(handle);
                    undo(&handles)
                })?;
                handles.push(handle);
            }
        } else {
            // One allocation, one mapping: giving it back is one unmap, not one per chunk.
            let handle = device.create_chunks_at(location, self.slab_chunks).inspect_err(|_| undo(&[]))?;
            device.map_sized(va, handle, size).inspect_err(|_| {
                let _ = device.release_chunk(handle);
                undo(&[])
            })?;
            handles.push(handle);
        }
        device.set_access_from(va, size, &[self.me]).inspect_err(|_| undo(&handles))?;
        let index = self.slabs.len();
        self.slabs.push(Some(Slab { lender, lent: None, va, handles, used: 0, draining: false }));
        self.lenders[lender].live_slabs += 1;
        let base = (index * self.slab_chunks) as u32;
        self.free.extend((base..base + self.slab_chunks as u32).map(PeerSlot));
        Ok(())
    }

    /// The first run of `n` consecutive free slots inside one slab of a lender that is `open`.
    fn find_run(&self, n: usize, open: impl Fn(usize) -> bool) -> Option<Vec<PeerSlot>> {
        let free = self.free.iter().filter(|&&s| open(self.lender_of(s))).map(|s| s.0);
        let start = crate::slot_runs::first_free_run(free, n, self.slab_chunks as u32)?;
        Some((start..start + n as u32).map(PeerSlot).collect())
    }

    /// Gives `slot` back. A slot of a draining slab is not handed out again.
    pub fn free(&mut self, slot: PeerSlot) {
        let (index, _) = self.split(slot);
        let slab = self.slabs[index].as_mut().expect("a slot of a live slab");
        debug_assert!(slab.used > 0, "peer slot {slot:?} freed twice");
        slab.used -= 1;
        if !slab.draining {
            let fresh = self.free.insert(slot);
            debug_assert!(fresh, "peer slot {slot:?} freed twice");
        }
    }

    /// Lowers (or raises) what GPU `gpu` lends to `bytes`: slabs beyond it, emptiest first, start
    /// draining. Returns whether any slab drains now.
    pub fn set_cap(&mut self, gpu: usize, bytes: usize) -> bool {
        let Some(lender) = self.lenders.iter().position(|l| l.gpu == gpu) else { return false };
        let cap_slabs = bytes / self.chunk / self.slab_chunks;
        self.lenders[lender].cap_slabs = cap_slabs;
        let mut mine: Vec<usize> = (0..self.slabs.len())
            .filter(|&i| self.slabs[i].as_ref().is_some_and(|s| s.lender == lender && s.lent.is_none() && !s.draining))
            .collect();
        // Slabs draining already go back anyway: only those kept count against the cap.
        let excess = mine.len().saturating_sub(cap_slabs);
        mine.sort_by_key(|&i| self.slabs[i].as_ref().map_or(0, |s| s.used));
        for &i in &mine[..excess] {
            self.slabs[i].as_mut().expect("live").draining = true;
            let base = (i * self.slab_chunks) as u32;
            for s in base..base + self.slab_chunks as u32 {
                self.free.remove(&PeerSlot(s));
            }
        }
        self.draining()
    }

    /// GPU `gpu` lends at most `bytes` from now on, and that much now (the lender watch lowers
    /// it when the lender is short of memory). Returns whether any slab drains now.
    pub fn set_most(&mut self, gpu: usize, bytes: usize) -> bool {
        if let Some(lender) = self.lenders.iter_mut().find(|l| l.gpu == gpu) {
            lender.most = bytes;
        }
        self.set_cap(gpu, bytes)
    }

    /// Whether some slab is draining.
    pub fn draining(&self) -> bool {
        self.live().any(|s| s.draining)
    }

    /// Whether a draining slab still has a slot in use.
    pub fn draining_in_use(&self) -> bool {
        self.live().any(|s| s.draining && s.used > 0)
    }

    /// Whether `slot` is in a draining slab: its chunk must move out.
    pub fn is_draining(&self, slot: PeerSlot) -> bool {
        self.slabs[self.split(slot).0].as_ref().is_some_and(|s| s.draining)
    }

    /// Gives back to their lenders the draining slabs no chunk uses any more: unmapped, their
    /// chunks released, their range unreserved. Returns the bytes given back.
    pub fn release_drained(&mut self, device: &dyn Device) -> Result<usize> {
        let mut given = 0;
        for index in 0..self.slabs.len() {
            if !self.slabs[index].as_ref().is_some_and(|s| s.draining && s.used == 0) {
                continue;
            }
            let size = self.slab_chunks * self.chunk;
            let slab = self.slabs[index].as_ref().expect("checked");
            // A slab that could not be given back stays draining, to be tried again.
            self.unmake(device, slab)?;
            let slab = self.slabs[index].take().expect("checked");
            match slab.lent {
                Some(id) => self.returned_lent.push(id),
                None => self.lenders[slab.lender].live_slabs -= 1,
            }
            given += size;
        }
        Ok(given)
    }

    /// Unmaps a slab's range, frees the range and releases the allocation (its memory goes
    /// back to the lender with its last mapping).
    fn unmake(&self, device: &dyn Device, slab: &Slab) -> Result<()> {
        self.unmap_slab(device, slab.va, slab.handles.len())?;
        device.unreserve(slab.va, self.slab_chunks * self.chunk)?;
        slab.handles.iter().try_for_each(|&handle| device.release_mapped_chunk(handle))
    }

    /// Unmaps a slab's range, of which `mapped` allocations are mapped (in place: one
    /// granule each, from its start; else one over the whole range, or none). A whole slab
    /// goes in one call; a part, or a slab in place whose driver refuses a range of several
    /// mappings, granule by granule. Each call is tried a few times: a failed unmap changes
    /// nothing, and a mapping left behind would keep the range and its memory for ever.
    fn unmap_slab(&self, device: &dyn Device, va: DevicePtr, mapped: usize) -> Result<()> {
        let size = self.slab_chunks * self.chunk;
        if mapped == 0 {
            return Ok(());
        }
        if !self.in_place {
            return retried(UNMAP_TRIES, || device.unmap(va, size));
        }
        if mapped == self.slab_chunks && device.unmap(va, size).is_ok() {
            return Ok(());
        }
        (0..mapped).try_for_each(|i| retried(UNMAP_TRIES, || device.unmap(va + (i * self.chunk) as u64, self.chunk)))
    }

    /// Gives every slab back (shutdown: no slot is in use).
    pub fn release_all(&mut self, device: &dyn Device) -> Result<()> {
        let mut outcome = Ok(());
        for slab in std::mem::take(&mut self.slabs).into_iter().flatten() {
            outcome = outcome.and(self.unmake(device, &slab));
        }
        self.lenders.iter_mut().for_each(|l| l.live_slabs = 0);
        self.free.clear();
        outcome
    }
}

/// How often an unmap is tried before its failure is believed.
const UNMAP_TRIES: usize = 4;

/// `call`, tried up to `tries` times until it succeeds; its last error if it never does.
fn retried(tries: usize, mut call: impl FnMut() -> Result<()>) -> Result<()> {
    let mut outcome = call();
    for _ in 1..tries {
        if outcome.is_ok() {
            break;
        }
        outcome = call();
    }
    outcome
}

#[path = "peer_lent.rs"]
mod lent;

#[cfg(test)]
#[path = "peer_tier_tests.rs"]
mod tests;
