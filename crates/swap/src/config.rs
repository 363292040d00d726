//! How a [`crate::VramStore`] is set up: the device's size, the engine beneath it, the areas,
//! the limits, and the monitor's pace.
//!
//! The engine's host tier is the store's staging area, not a cache: it is pinned, so it is
//! never swapped (the serving process must not depend on memory that is itself being swapped
//! to this device), and small (256 MiB unless set), since the memory it takes is memory the
//! host's programs wanted. What leaves HBM passes through it on its way to the spill file.

use crate::limits::Limits;
use crate::SwapError;
use std::path::PathBuf;
use std::time::Duration;
use tiermem::policy::PolicyKind;
use tiermem::EngineConfig;

/// The host tier when `engine.host_limit` is not set: 256 MiB.
pub const DEFAULT_HOST_STAGING: usize = 256 << 20;
/// How often the monitor reads the GPU and applies the limits.
pub const DEFAULT_POLL: Duration = Duration::from_millis(100);

/// The settings of [`crate::VramStore::open`]. Plain data; every field may be set directly.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// The device's size in bytes: a multiple of 4096.
    pub size: u64,
    /// The engine: `device` (GPU ordinal), `backend` (`sim` on a machine without a GPU),
    /// `file` and `file_limit` (the spill file and its size), `host_limit` (the staging tier),
    /// `policy` (LRU among areas by default). `hbm_limit`, if set, caps the budget for the
    /// store's whole life, as a grant would ([`crate::VramStore::set_external_cap`] replaces
    /// it); the limits decide the budget below it.
    pub engine: EngineConfig,
    /// Bytes per area: a multiple of the engine's chunk (one granule, 2 MiB, unless `engine`
    /// says otherwise); `None`: one chunk. Larger
    /// areas mean fewer engine buffers but memory is freed only when a whole area is discarded.
    pub area_size: Option<u64>,
    /// The soft and hard limits and the least budget (limits.rs).
    pub limits: Limits,
    /// The node daemon's grant, if any: the budget never exceeds it.
    pub external_cap: Option<u64>,
    /// How often the monitor thread applies the limits; `None`: no thread, the limits are
    /// applied only at open and by `set_limits`, `set_external_cap` and `apply_limits`.
    pub poll: Option<Duration>,
}

impl StoreConfig {
    /// A device of `size` bytes that spills to `spill`, sized to hold the whole device (so
    /// every byte can leave VRAM), with a 256 MiB host staging tier, LRU among areas, the
    /// default limits and a monitor polling every 100 ms. Other engine settings are the
    /// engine's defaults (`backend` auto: the GPU if there is one).
    pub fn new(size: u64, spill: Option<PathBuf>) -> Self {
        let file_limit = if spill.is_some() { size as usize } else { 0 };
        Self {
            size,
            engine: EngineConfig {
                host_limit: Some(DEFAULT_HOST_STAGING),
                file: spill,
                file_limit,
                policy: PolicyKind::Lru,
                // Chunks of one granule (2 MiB), not the engine's default: swapped pages
                // come and go 4 KiB at a time, and an area is freed only whole.
                chunk: None,
                // A host that swaps is short of memory: its staging tier is pinned as spills
                // need it, never ahead of a cut (evict_room.rs).
                evict_room: false,
                ..EngineConfig::default()
            },
            area_size: None,
            limits: Limits::default(),
            external_cap: None,
            poll: Some(DEFAULT_POLL),
        }
    }

    /// Refuses settings that cannot work, before anything is opened.
    pub(crate) fn check(&self) -> Result<(), SwapError> {
        let config = |detail: String| SwapError::Config { call: "VramStore::open", detail };
        if self.size == 0 || !self.size.is_multiple_of(crate::PAGE) {
            return Err(config(format!("size {} is not a positive multiple of 4096 bytes", self.size)));
        }
        if self.area_size == Some(0) {
            return Err(config("area_size 0: an area is at least one engine chunk".into()));
        }
        self.limits.check().map_err(config)
    }
}
