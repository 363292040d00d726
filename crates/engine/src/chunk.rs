//! The chunk state machine.
//!
//! A buffer is a reserved VA range cut into chunks of one granule (2 MiB). The VA never
//! changes; what sits behind each chunk does:
//!
//! ```text
//!            first acquire (zero-fill)              acquire / prefetch / page_in (copy up)
//!   Empty ─────────────────────────────▶ Device ◀──────────────────────────────────── Host
//!                                          │  ▲                                         ▲
//!                      clean: unmap only   │  │ acquired while moving down:              │
//!                      dirty: copy down    ▼  │ becomes Device again (keeps copy)        │
//!                                       PagingOut ─────── fence done: unmap, free HBM ──┘
//! ```
//!
//! * `Empty` — never written; nothing behind the VA. Made resident as zeros.
//! * `Host { slot }` — unmapped; the data is in a pinned host slot. A kernel must not touch it.
//! * `Device { phys, copy }` — mapped in local HBM at full speed. `copy` is a host slot that
//!   still holds identical bytes (the chunk is *clean*): evicting it is an unmap, no copy
//!   (GDM's LRU-COST relies on this). An acquire for writing drops the copy (*dirty*).
//! * `PagingOut { phys, slot, fence }` — still mapped; a copy to `slot` (or, for a clean chunk,
//!   the user's last work on it) is in flight, and `fence` marks its end. When the fence has
//!   completed the chunk is unmapped and becomes `Host` (or `File`, for a chunk whose only
//!   other copy is in the file: then `slot` is `None`).
//! * `File` — unmapped; the data is only in the file tier (`file`).
//!
//! Orthogonally, `file` is a slot of the file tier holding identical bytes, in any state: a
//! chunk paged in from the file keeps it, so evicting it again writes nothing (the Bakita
//! paper's read-only buffers, written once). An acquire for writing drops it, like `copy`.
//! A full host tier spills its coldest `Host` chunks to the file; a page-in from the file
//! reads into a separate pinned staging area, so it takes no room in the host tier.
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
}

impl Chunk {
    pub fn new() -> Self {
        Self { state: ChunkState::Empty, pins: 0, last_use: 0, ready: None, busy: None, file: None }
    }

    /// Mapped in HBM and usable (possibly still arriving: see `ready`).
    pub fn is_resident(&self) -> bool {
        matches!(self.state, ChunkState::Device { .. })
    }
}
