//! The state core: buffers, their chunks, and which chunk each physical chunk of HBM serves.
//! [`ChunkTable`] is the only writer of chunk state; everything else reads chunks and asks the
//! table for a transition, which keeps the derived counts (chunks mapped per buffer, chunks
//! acquired, the holder of each physical chunk) in step.
//!
//! # A chunk's tiers, as data
//!
//! A buffer is a reserved VA range cut into chunks of whole granules (4 MiB by default). The VA never
//! changes; what sits behind each chunk does. A chunk has a copy in some of the tiers:
//!
//! * `hbm` — mapped in local HBM at a physical chunk, usable at full speed. While `leaving` is
//!   set, a move down is in flight (a copy into the host slot, or for a clean chunk just the
//!   user's last work on it) and the fence marks its end; the chunk still serves acquires,
//!   which cancel the move.
//! * `peer` — a slot of HBM lent by a neighbour GPU (peer_tier.rs) holding identical bytes
//!   (once the copy that fills it, over NVLink, has completed).
//! * `host` — a pinned host slot holding identical bytes (once the copy that fills it, if
//!   any, has completed).
//! * `file` — a slot of the file tier holding identical bytes.
//!
//! Its **location** ([`Location`]) is the highest of them: where a kernel or a page-in finds
//! the bytes. The lower ones are *copies*: a resident chunk with a copy is *clean*, so evicting
//! it is bookkeeping, no copy (GDM's LRU-COST relies on this; the Bakita paper's read-only
//! buffers are written to the file once). An acquire for writing drops the copies (*dirty*).
//! A chunk with no copy anywhere was never written: it is made resident as zeros.
//!
//! ```text
//!            first acquire (zero-fill)              acquire / prefetch / page_in (copy up)
//!   Empty ─────────────────────────────▶ HBM ◀──────────────────────────────────── host / file
//!                                          │  ▲                                       ▲
//!                      clean: leaves now   │  │ acquired while leaving:               │
//!                      dirty: copy down    ▼  │ cancels the move (keeps the copy)     │
//!                                     HBM, leaving ──── fence done: HBM back to pool ─┘
//! ```
//!
//! A full host tier spills its coldest host-located chunks to the file; a page-in from the
//! file reads into a separate pinned staging area, so it takes no room in the host tier.
//!
//! **Stale mappings.** A chunk that leaves HBM keeps its mapping: `alias` is the physical
//! chunk its address still maps, which the pool may meanwhile give to another chunk. Unmapping
//! and mapping again cost ~50 µs of driver time per chunk (more than its 38 µs copy), so
//! evicting is bookkeeping only, and a chunk coming back takes its old physical chunk if that
//! is free (homes.rs). A stale mapping is never read: only acquired chunks may be touched, and
//! those are resident.
//!
//! **Mapped in place** (movement.rs, "Reading in place"). A chunk located in the peer tier may have its address
//! mapped to its peer slot instead (`in_place`): an acquire that allows it then pins the chunk
//! there, with no copy, and kernels read it over NVLink. Such a chunk is never brought into
//! HBM while acquired; unpinned, its mapping is undone (like a stale one) before it is mapped
//! in HBM or gives its peer slot up. `pinned` counts only chunks acquired in HBM: a chunk
//! acquired in place takes none.
//!
//! Two fences ride along with every chunk: `ready` (the copy that brought it up; users'
//! streams wait on it) and `busy` (the user's work since the last release; the chunk may be
//! moved down only after it). A chunk with `pins > 0` is acquired and is never moved.
//!
//! **Handed over** (hand_overs.rs). A dirty chunk leaving to make room for a chunk
//! coming in leaves HBM at once, before its copy down has run: the
//! incoming copy or zero fill waits for it on the device. Until then the chunk is `landing` (its fence):
//! located on the host, but its slot still filling and its address still read.
//!
//! Invariants the table keeps: a buffer's `mapped` counts its chunks with `hbm`; `holders`
//! maps exactly the physical chunks of chunks with `hbm`; `pinned` counts chunks with
//! `pins > 0` and in HBM; a chunk without `hbm` has no `ready` fence, and a `busy` fence only
//! while mapped in place (its last use there).

use crate::buffer::{AllocOptions, BufferId};
use crate::fence::Fence;
use crate::host_tier::Slot;
use crate::peer_tier::PeerSlot;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use tiermem_mechanism::file_store::FileSlot;
use tiermem_mechanism::{DevicePtr, PhysHandle};
use tiermem_policy::Tier;

mod copies;

/// A chunk: its buffer and its index in the buffer.
pub(crate) type ChunkRef = (BufferId, usize);

/// Where a chunk's bytes are: the highest tier that holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Location {
    /// Never written.
    Empty,
    /// Mapped in HBM; `leaving` while a move down is in flight.
    Hbm {
        phys: PhysHandle,
        leaving: bool,
    },
    Peer(PeerSlot),
    Host(Slot),
    File(FileSlot),
}

struct Hbm {
    phys: PhysHandle,
    leaving: Option<Arc<Fence>>,
    /// The move down is a copy into a host slot (the chunk was dirty).
    to_host: bool,
}

/// Whether a chunk's address maps its peer slot (movement.rs, "Reading in place").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InPlace {
    No,
    /// Mapped, with access: an acquire may be served there.
    Mapped,
    /// Mapped, but `cuMemSetAccess` failed and so did the unmap: only to be unmapped.
    LacksAccess,
}

/// The slot below HBM that a chunk's copy down fills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Below {
    Peer(PeerSlot),
    Host(Slot),
}

/// A chunk's copies below HBM, dropped together when it is written.
#[derive(Debug, Default)]
pub(crate) struct Copies {
    pub peer: Option<PeerSlot>,
    pub host: Option<Slot>,
    pub file: Option<FileSlot>,
}

pub(crate) struct Chunk {
    hbm: Option<Hbm>,
    peer: Option<PeerSlot>,
    host: Option<Slot>,
    file: Option<FileSlot>,
    pins: u32,
    last_use: u64,
    ready: Option<Arc<Fence>>,
    busy: Option<Arc<Fence>>,
    alias: Option<PhysHandle>,
    /// The stale mapping was never given access (a page-in failed in `cuMemSetAccess` and
    /// its unmap failed too): it must be unmapped before the chunk is mapped again.
    alias_lacks_access: bool,
    /// How its address maps its peer slot, if it does (then `alias` is `None`).
    in_place: InPlace,
    /// Evicted since the schedule was set: it streams, so it may make way for an incoming
    /// chunk whose home it holds (homes.rs).
    streamed: bool,
    /// Handed its physical chunk over while leaving (`hand_over`): until this fence, its copy
    /// down may still be reading its address and filling its slot below.
    landing: Option<Arc<Fence>>,
}

impl Chunk {
    fn new() -> Self {
        Self {
            hbm: None,
            peer: None,
            host: None,
            file: None,
            pins: 0,
            last_use: 0,
            ready: None,
            busy: None,
            alias: None,
            alias_lacks_access: false,
            in_place: InPlace::No,
            streamed: false,
            landing: None,
        }
    }

    pub fn location(&self) -> Location {
        match (&self.hbm, self.peer, self.host, self.file) {
            (Some(hbm), ..) => Location::Hbm { phys: hbm.phys, leaving: hbm.leaving.is_some() },
            (None, Some(slot), ..) => Location::Peer(slot),
            (None, None, Some(slot), _) => Location::Host(slot),
            (None, None, None, Some(slot)) => Location::File(slot),
            (None, None, None, None) => Location::Empty,
        }
    }

    /// Mapped in HBM and usable (possibly still arriving: see `ready`), no move down in flight.
    pub fn is_resident(&self) -> bool {
        self.hbm.as_ref().is_some_and(|hbm| hbm.leaving.is_none())
    }

    /// Mapped in HBM, leaving or not.
    pub fn phys(&self) -> Option<PhysHandle> {
        self.hbm.as_ref().map(|hbm| hbm.phys)
    }

    /// The fence of the move down in flight.
    pub fn leaving(&self) -> Option<&Arc<Fence>> {
        self.hbm.as_ref().and_then(|hbm| hbm.leaving.as_ref())
    }

    /// The fence of its move down while that is a copy into a host slot: its physical chunk
    /// may be handed over (hand_overs.rs).
    pub fn copying_to_host(&self) -> Option<&Arc<Fence>> {
        self.hbm.as_ref().filter(|hbm| hbm.to_host).and_then(|hbm| hbm.leaving.as_ref())
    }

    pub fn peer(&self) -> Option<PeerSlot> {
        self.peer
    }

    pub fn host(&self) -> Option<Slot> {
        self.host
    }

    pub fn file(&self) -> Option<FileSlot> {
        self.file
    }

    /// Resident with an identical copy below (peer, host or file): evicting it copies nothing.
    pub fn is_clean(&self) -> bool {
        self.copy_below().is_some()
    }

    /// The fastest tier below HBM holding an identical copy, if any.
    pub fn copy_below(&self) -> Option<Tier> {
        match (self.peer, self.host, self.file) {
            (Some(_), ..) => Some(Tier::Peer),
            (None, Some(_), _) => Some(Tier::Host),
            (None, None, Some(_)) => Some(Tier::File),
            (None, None, None) => None,
        }
    }

    pub fn pins(&self) -> u32 {
        self.pins
    }

    pub fn last_use(&self) -> u64 {
        self.last_use
    }

    pub fn ready(&self) -> Option<&Arc<Fence>> {
        self.ready.as_ref()
    }

    pub fn busy(&self) -> Option<&Arc<Fence>> {
        self.busy.as_ref()
    }

    /// The fences of work that may still touch the chunk in HBM: its arrival and its last use.
    pub fn in_flight(&self) -> impl Iterator<Item = &Arc<Fence>> {
        [&self.busy, &self.ready].into_iter().flatten()
    }

    pub fn alias(&self) -> Option<PhysHandle> {
        self.alias
    }

    /// Whether its address maps anything while it is not in HBM (a stale mapping, or its peer
    /// slot in place): to be unmapped before it is mapped again, and by `free`.
    pub fn maps_below(&self) -> bool {
        self.alias.is_some() || self.in_place != InPlace::No
    }

    /// Its address maps its peer slot (usable or not): undone before the slot is given up.
    pub fn maps_in_place(&self) -> bool {
        self.in_place != InPlace::No
    }

    /// Its address maps its peer slot, usable: an acquire may pin it there.
    pub fn is_in_place(&self) -> bool {
        self.in_place == InPlace::Mapped
    }

    /// Acquired where it lies in the peer tier: it must stay there until released.
    pub fn pinned_in_place(&self) -> bool {
        self.pins > 0 && self.hbm.is_none()
    }

    /// Whether a page-in to `phys` needs no driver call: the address still maps it, with access.
    pub fn maps(&self, phys: PhysHandle) -> bool {
        self.alias == Some(phys) && !self.alias_lacks_access
    }

    pub fn streamed(&self) -> bool {
        self.streamed
    }

    /// The move down still in flight of a chunk that has left HBM already (`hand_over`): a
    /// copy from its slot below waits for it on the device; unmapping its address, freeing
    /// its buffer or writing its slot to the file waits for it on the host.
    pub fn landing(&self) -> Option<&Arc<Fence>> {
        self.landing.as_ref()
    }
}

pub(crate) struct Buffer {
    pub va: DevicePtr,
    pub size: usize,
    pub reserved: usize,
    pub options: AllocOptions,
    chunks: Vec<Chunk>,
    /// Chunks mapped in HBM, so eviction can skip buffers with none.
    mapped: usize,
}

impl Buffer {
    pub fn chunks(&self) -> &[Chunk] {
        &self.chunks
    }

    pub fn mapped(&self) -> usize {
        self.mapped
    }
}

/// What a chunk entering HBM is filled with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fill {
    /// Its bytes, copied up from the host or read from the file.
    Copied,
    /// Zeros: it was never written.
    Zeroed,
}

pub(crate) struct ChunkTable {
    chunk: usize,
    buffers: BTreeMap<BufferId, Buffer>,
    next_buffer: u64,
    clock: u64,
    /// Chunks acquired (`pins > 0`): HBM that eviction cannot free.
    pinned: usize,
    /// The chunk each physical chunk in use serves (homes.rs).
    holders: HashMap<PhysHandle, ChunkRef>,
    /// Counts chunks that stopped being resident (started leaving or left HBM): while it is
    /// unchanged, every chunk resident then still is (`Schedule::quiet`).
    departures: u64,
}

impl ChunkTable {
    pub fn new(chunk: usize) -> Self {
        Self {
            chunk,
            buffers: BTreeMap::new(),
            next_buffer: 1,
            clock: 0,
            pinned: 0,
            holders: HashMap::new(),
            departures: 0,
        }
    }

    /// The size of a chunk in bytes.
    pub fn chunk_size(&self) -> usize {
        self.chunk
    }

    // --- reading ----------------------------------------------------------------------------

    pub fn buffer(&self, id: BufferId) -> Option<&Buffer> {
        self.buffers.get(&id)
    }

    pub fn buffers(&self) -> impl Iterator<Item = (BufferId, &Buffer)> {
        self.buffers.iter().map(|(&id, b)| (id, b))
    }

    pub fn ids(&self) -> Vec<BufferId> {
        self.buffers.keys().copied().collect()
    }

    /// Chunk `r` of a live buffer.
    pub fn chunk(&self, (id, index): ChunkRef) -> &Chunk {
        &self.buffers.get(&id).expect("chunk of a live buffer").chunks[index]
    }

    /// Every chunk of every buffer, in order.
    pub fn chunks(&self) -> impl Iterator<Item = (ChunkRef, &Chunk)> {
        self.buffers.iter().flat_map(|(&id, b)| b.chunks.iter().enumerate().map(move |(i, c)| ((id, i), c)))
    }

    /// The device address of chunk `r`.
    pub fn va(&self, (id, index): ChunkRef) -> DevicePtr {
        self.buffers[&id].va + (index * self.chunk) as u64
    }

    /// Chunks acquired now.
    pub fn pinned(&self) -> usize {
        self.pinned
    }

    /// How many times a chunk has stopped being resident, ever: unchanged, no chunk has.
    pub fn departures(&self) -> u64 {
        self.departures
    }

    /// The chunk that physical chunk `phys` serves, if any.
    pub fn holder(&self, phys: PhysHandle) -> Option<ChunkRef> {
        self.holders.get(&phys).copied()
    }

    /// Whether chunk `r` (of a buffer still alive) holds `slot` as a copy of its bytes.
    pub fn holds_slot(&self, (id, index): ChunkRef, slot: Slot) -> bool {
        self.buffers.get(&id).is_some_and(|b| b.chunks[index].host == Some(slot))
    }

    // --- buffers ----------------------------------------------------------------------------

    /// A new buffer of `size` bytes at `va` (`reserved` bytes, whole chunks), every chunk empty.
    pub fn add_buffer(&mut self, va: DevicePtr, size: usize, reserved: usize, options: AllocOptions) -> BufferId {
        let id = BufferId(self.next_buffer);
        self.next_buffer += 1;
        let chunks = (0..reserved / self.chunk).map(|_| Chunk::new()).collect();
        self.buffers.insert(id, Buffer { va, size, reserved, options, chunks, mapped: 0 });
        id
    }

    /// Removes a buffer none of whose chunks is in HBM or acquired; returns the copies its
    /// chunks held, for the caller to free.
    pub fn remove_buffer(&mut self, id: BufferId) -> Vec<Copies> {
        let buffer = self.buffers.remove(&id).expect("a live buffer");
        debug_assert_eq!(buffer.mapped, 0, "a removed buffer has nothing in HBM");
        buffer.chunks.into_iter().map(|c| Copies { peer: c.peer, host: c.host, file: c.file }).collect()
    }

    /// Forgets a buffer that could not be freed, at shutdown: its driver objects go with the
    /// engine's.
    pub fn forget_buffer(&mut self, id: BufferId) {
        if let Some(buffer) = self.buffers.remove(&id) {
            for chunk in &buffer.chunks {
                if let Some(hbm) = &chunk.hbm {
                    self.holders.remove(&hbm.phys);
                }
                self.pinned -= usize::from(chunk.pins > 0 && chunk.hbm.is_some());
            }
        }
    }

    // --- transitions ------------------------------------------------------------------------

    fn at(&mut self, (id, index): ChunkRef) -> &mut Chunk {
        &mut self.buffers.get_mut(&id).expect("chunk of a live buffer").chunks[index]
    }

    /// Chunk `r` (not in HBM) is now mapped at `phys`, filled from its highest copy or with
    /// zeros (returned); its copies stay valid copies.
    pub fn enter_hbm(&mut self, r: ChunkRef, phys: PhysHandle) -> Fill {
        let chunk = self.at(r);
        debug_assert!(chunk.hbm.is_none(), "a chunk enters HBM once");
        debug_assert!(chunk.in_place == InPlace::No, "a chunk mapped in place is unmapped before it enters HBM");
        chunk.hbm = Some(Hbm { phys, leaving: None, to_host: false });
        (chunk.alias, chunk.landing) = (None, None);
        let fill = if chunk.is_clean() { Fill::Copied } else { Fill::Zeroed };
        self.holders.insert(phys, r);
        self.buffers.get_mut(&r.0).expect("chunk of a live buffer").mapped += 1;
        fill
    }

    /// Chunk `r` (resident) starts moving down behind `fence`; `to` is the slot a copy down
    /// fills (a dirty chunk), `None` for a clean chunk, which only waits for its last use.
    pub fn start_leaving(&mut self, r: ChunkRef, fence: Arc<Fence>, to: Option<Below>) {
        self.departures += 1;
        let chunk = self.at(r);
        let hbm = chunk.hbm.as_mut().expect("a chunk leaving HBM is in HBM");
        hbm.leaving = Some(fence);
        hbm.to_host = matches!(to, Some(Below::Host(_)));
        match to {
            Some(Below::Host(slot)) => {
                debug_assert!(chunk.host.is_none(), "a dirty chunk has no host copy");
                chunk.host = Some(slot);
            }
            Some(Below::Peer(slot)) => {
                debug_assert!(chunk.peer.is_none(), "a dirty chunk has no peer copy");
                chunk.peer = Some(slot);
            }
            None => {}
        }
    }

    /// An acquire cancels chunk `r`'s move down: it stays in HBM, clean, and users wait for the
    /// copy in flight (it may still be reading the chunk) before they write.
    pub fn cancel_leaving(&mut self, r: ChunkRef) {
        let chunk = self.at(r);
        if let Some(fence) = chunk.hbm.as_mut().and_then(|hbm| {
            hbm.to_host = false;
            hbm.leaving.take()
        }) {
            chunk.ready = Some(fence);
        }
    }

    /// Chunk `r` leaves HBM; nothing may still use it there. Its address keeps mapping the
    /// physical chunk, stale. Returns the physical chunk, for the pool.
    pub fn leave_hbm(&mut self, r: ChunkRef) -> PhysHandle {
        self.departures += 1;
        let chunk = self.at(r);
        let hbm = chunk.hbm.take().expect("a chunk leaving HBM is in HBM");
        (chunk.ready, chunk.busy) = (None, None);
        chunk.alias = Some(hbm.phys);
        self.holders.remove(&hbm.phys);
        self.buffers.get_mut(&r.0).expect("chunk of a live buffer").mapped -= 1;
        hbm.phys
    }

    /// Chunk `r`, leaving HBM behind a fence (returned with its physical chunk), leaves now:
    /// its physical chunk may be taken by a copy that waits for that fence on the device
    /// (hand_overs.rs). Until then it is `landing`.
    pub fn hand_over(&mut self, r: ChunkRef) -> (PhysHandle, Arc<Fence>) {
        let fence = self.chunk(r).copying_to_host().cloned().expect("a chunk handed over is copied to the host");
        let phys = self.leave_hbm(r);
        self.at(r).landing = Some(Arc::clone(&fence));
        (phys, fence)
    }

    /// Chunk `r`'s address maps nothing any more.
    pub fn unmapped(&mut self, r: ChunkRef) {
        let chunk = self.at(r);
        (chunk.alias, chunk.alias_lacks_access, chunk.in_place) = (None, false, InPlace::No);
        if chunk.hbm.is_none() {
            // The last use in place, waited for by whoever unmapped it.
            chunk.busy = None;
        }
    }

    /// Chunk `r` (located in the peer tier, its address unmapped) now has its peer slot mapped
    /// at its address: usable (`with_access`) or only to be unmapped.
    pub fn mapped_in_place(&mut self, r: ChunkRef, with_access: bool) {
        let chunk = self.at(r);
        debug_assert!(chunk.hbm.is_none() && chunk.peer.is_some() && chunk.alias.is_none(), "in place: a peer chunk");
        chunk.in_place = if with_access { InPlace::Mapped } else { InPlace::LacksAccess };
    }

    /// A mapping of `phys` at chunk `r`'s address could not be undone, and has no access: it
    /// must be unmapped before the chunk is mapped again, and by `free`.
    pub fn mapped_without_access(&mut self, r: ChunkRef, phys: PhysHandle) {
        let chunk = self.at(r);
        (chunk.alias, chunk.alias_lacks_access) = (Some(phys), true);
    }

    /// Chunk `r` is acquired at `clock`; `true` if it was not acquired before.
    fn pin(&mut self, r: ChunkRef, clock: u64) -> bool {
        let chunk = self.at(r);
        debug_assert!(chunk.hbm.is_some() || chunk.in_place == InPlace::Mapped, "acquired: in HBM or in place");
        chunk.pins += 1;
        chunk.last_use = clock;
        let newly = chunk.pins == 1;
        self.pinned += usize::from(newly && chunk.hbm.is_some());
        newly
    }

    /// Acquires `refs` (resident, or mapped in place), one tick of the clock for all.
    pub fn pin_all(&mut self, refs: &[ChunkRef]) {
        self.clock += 1;
        let clock = self.clock;
        refs.iter().for_each(|&r| {
            self.pin(r, clock);
        });
    }

    /// Chunk `r` is released; `busy` marks the end of the work on it. `true` if no acquire is
    /// left.
    pub fn unpin(&mut self, r: ChunkRef, busy: Arc<Fence>) -> bool {
        let chunk = self.at(r);
        chunk.pins -= 1;
        chunk.busy = Some(busy);
        let unpinned = chunk.pins == 0;
        self.pinned -= usize::from(unpinned && chunk.hbm.is_some());
        unpinned
    }

    /// Drops every acquire (shutdown).
    pub fn unpin_everything(&mut self) {
        self.buffers.values_mut().flat_map(|b| &mut b.chunks).for_each(|c| c.pins = 0);
        self.pinned = 0;
    }

    /// The fence after which chunk `r` has arrived (or `None`: it has).
    pub fn set_ready(&mut self, r: ChunkRef, ready: Option<Arc<Fence>>) {
        self.at(r).ready = ready;
    }

    /// Chunk `r` was evicted while a schedule is set: it streams.
    pub fn mark_streamed(&mut self, r: ChunkRef) {
        self.at(r).streamed = true;
    }

    /// A new schedule: no chunk has streamed along it yet.
    pub fn forget_streaming(&mut self) {
        self.buffers.values_mut().flat_map(|b| &mut b.chunks).for_each(|c| c.streamed = false);
    }
}
