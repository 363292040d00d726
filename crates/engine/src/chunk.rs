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
//!   completed the chunk is unmapped and becomes `Host`.
//!
//! Two fences ride along with every chunk: `ready` (the copy that brought it up; users'
//! streams wait on it) and `busy` (the user's work since the last release; the chunk may be
//! moved down only after it). A chunk with `pins > 0` is acquired and is never moved.

use crate::fence::Fence;
use crate::host_tier::Slot;
use std::sync::Arc;
use tiermem_mechanism::PhysHandle;

pub(crate) enum ChunkState {
    Empty,
    Host { slot: Slot },
    Device { phys: PhysHandle, copy: Option<Slot> },
    PagingOut { phys: PhysHandle, slot: Slot, fence: Arc<Fence> },
}

pub(crate) struct Chunk {
    pub state: ChunkState,
    pub pins: u32,
    pub last_use: u64,
    pub ready: Option<Arc<Fence>>,
    pub busy: Option<Arc<Fence>>,
}

impl Chunk {
    pub fn new() -> Self {
        Self { state: ChunkState::Empty, pins: 0, last_use: 0, ready: None, busy: None }
    }

    /// Mapped in HBM and usable (possibly still arriving: see `ready`).
    pub fn is_resident(&self) -> bool {
        matches!(self.state, ChunkState::Device { .. })
    }
}
