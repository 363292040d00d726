//! The chunk state machine.
//!
//! A buffer is a reserved VA range cut into chunks of one granule (2 MiB). The VA never
//! changes; what sits behind each chunk does:
//!
//! ```text
//!            first acquire (zero-fill)              acquire / prefetch / page_in (copy up)
//!   Empty ─────────────────────────────▶ Device ◀──────────────────────────────────── Host
//!                                          │  ▲                                         ▲
//!                      clean: leaves now   │  │ acquired while moving down:              │
//!                      dirty: copy down    ▼  │ becomes Device again (keeps copy)        │
//!                                       PagingOut ─────── fence done: HBM back to pool ─┘
//! ```
//!
//! * `Empty` — never written; nothing behind the VA. Made resident as zeros.
//! * `Host { slot }` — not resident; the data is in a pinned host slot. A kernel must not touch it.
//! * `Device { phys, copy }` — mapped in local HBM at full speed. `copy` is a host slot that
//!   still holds identical bytes (the chunk is *clean*): evicting it is bookkeeping, no copy
//!   (GDM's LRU-COST relies on this). An acquire for writing drops the copy (*dirty*).
//! * `PagingOut { phys, slot, fence }` — still mapped; a copy to `slot` (or, for a clean chunk,
//!   the user's last work on it) is in flight, and `fence` marks its end. When the fence has
//!   completed the chunk leaves HBM and becomes `Host` (or `File`, for a chunk whose only
//!   other copy is in the file: then `slot` is `None`).
//! * `File` — not resident; the data is only in the file tier (`file`).
//!
//! Orthogonally, `file` is a slot of the file tier holding identical bytes, in any state: a
//! chunk paged in from the file keeps it, so evicting it again writes nothing (the Bakita
//! paper's read-only buffers, written once). An acquire for writing drops it, like `copy`.
//! A full host tier spills its coldest `Host` chunks to the file; a page-in from the file
//! reads into a separate pinned staging area, so it takes no room in the host tier.
//!
//! **Stale mappings.** A chunk that leaves HBM keeps its mapping: `alias` is the physical
//! chunk its address still maps, which the pool may meanwhile give to another chunk. Unmapping
//! and mapping again cost ~50 µs of driver time per chunk (more than its 38 µs copy), so
//! evicting is bookkeeping only, and a chunk coming back takes its old physical chunk if that is
//! free — a loop that streams the same buffers through the same HBM every pass then makes no
//! driver call but the copies. Only a chunk that must take a *different* physical chunk unmaps
//! its stale mapping first; `free` unmaps them all. With a schedule, an incoming chunk sends
//! the streamed holder of its old physical chunk out first, so homes stay stable (homes.rs).
//! A stale mapping is never read: only acquired chunks may be touched, and those are resident.
//!
//! Two fences ride along with every chunk: `ready` (the copy that brought it up; users'
//! streams wait on it) and `busy` (the user's work since the last release; the chunk may be
//! moved down only after it). A chunk with `pins > 0` is acquired and is never moved.

use crate::fence::Fence;
use crate::host_tier::Slot;
use std::sync::Arc;
use tiermem_mechanism::file_store::FileSlot;
use tiermem_mechanism::PhysHandle;

pub(crate) enum ChunkState {
    Empty,
    Host { slot: Slot },
    Device { phys: PhysHandle, copy: Option<Slot> },
    PagingOut { phys: PhysHandle, slot: Option<Slot>, fence: Arc<Fence> },
    File,
}

pub(crate) struct Chunk {
    pub state: ChunkState,
    pub pins: u32,
    pub last_use: u64,
    pub ready: Option<Arc<Fence>>,
    pub busy: Option<Arc<Fence>>,
    /// A file-tier slot holding this chunk's current bytes.
    pub file: Option<FileSlot>,
    /// Not resident, but its address still maps this physical chunk (a stale mapping).
    pub alias: Option<PhysHandle>,
    /// The stale mapping was never given access (a page-in failed in `cuMemSetAccess` and
    /// its unmap failed too): it must be unmapped before the chunk is mapped again.
    pub alias_lacks_access: bool,
    /// Evicted since the schedule was set: it streams, so it may make way for an incoming
    /// chunk whose home it holds (homes.rs).
    pub streamed: bool,
}

impl Chunk {
    pub fn new() -> Self {
        Self {
            state: ChunkState::Empty,
            pins: 0,
            last_use: 0,
            ready: None,
            busy: None,
            file: None,
            alias: None,
            alias_lacks_access: false,
            streamed: false,
        }
    }

    /// Mapped in HBM and usable (possibly still arriving: see `ready`).
    pub fn is_resident(&self) -> bool {
        matches!(self.state, ChunkState::Device { .. })
    }
}
