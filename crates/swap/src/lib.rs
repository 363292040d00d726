//! CPU programs borrow idle VRAM (the GAME paper): host pages swapped into spare GPU memory.
//!
//! The bytes of a swap device live in a [`Blocks`] store over the tiermem engine: HBM first,
//! spilling to the engine's file tier when VRAM is short or wanted back by GPU work. Front ends
//! serve the store to the kernel as a block device (a FUSE file behind a loop device, where
//! there is no ublk or nbd), and the kernel uses that device as swap.
//!
//! The store, [`VramStore`]:
//!
//! ```text
//!  store.rs    VramStore: requests split by area, the Blocks calls, open, stats (stats.rs)
//!    │  areas.rs   areas (an engine buffer each, once written) and present bits per page
//!    │  gate.rs    no more engine copies in flight than the least budget holds
//!  monitor.rs  reads the GPU, applies the budget, records give-backs; a thread or on demand
//!  limits.rs   the budget as a pure function of free VRAM: soft, hard, grant (GAME §III)
//!  config.rs   StoreConfig
//! ```
//!
//! The front end and the server around it (docs/swap.md): `fuse_server.rs` (a direct_io FUSE
//! file per device), `serve.rs` (the server process), `control.rs` (its run directory, state
//! file and control socket), `system.rs` (mlockall, cgroups, losetup, swapon, /proc/swaps);
//! `mem_blocks.rs` is a store in host memory for tests.

mod areas;
mod config;
mod gate;
mod lanes;
pub mod limits;
mod monitor;
mod stats;
mod store;

pub use areas::PAGE;
pub use config::{StoreConfig, DEFAULT_HOST_STAGING, DEFAULT_POLL};
pub use limits::{Decision, Limits, Pressure, Reading};
pub use monitor::Applied;
pub use stats::{GiveBack, GiveBacks, Requests, StoreStats};
pub use store::VramStore;

pub mod control;
pub mod fuse_server;
pub mod mem_blocks;
pub mod serve;
pub mod system;

pub use fuse_server::{DeviceFile, FuseOptions, FuseServer};
pub use mem_blocks::MemBlocks;

/// What a block device's front end needs from the store behind it. Offsets and lengths are
/// bytes; the kernel sends whole sectors (512 B) and, for swap, whole pages.
pub trait Blocks: Send + Sync {
    /// The device's size in bytes.
    fn size(&self) -> u64;
    /// Fills `out` with the bytes at `offset`; bytes never written, or discarded since, read as
    /// zeros.
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), SwapError>;
    /// Stores `data` at `offset`.
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), SwapError>;
    /// Forgets `len` bytes at `offset` (swap's discards, `fallocate(PUNCH_HOLE)`): they read
    /// as zeros from now on, and memory that holds nothing else any more is given back.
    fn discard(&self, offset: u64, len: u64) -> Result<(), SwapError>;
}

/// Why a block request failed. The front end answers the kernel with [`SwapError::errno`];
/// nothing else in the store is affected.
#[derive(Debug, thiserror::Error)]
pub enum SwapError {
    #[error("{call} of {len} bytes at {offset}: outside the device's {size} bytes")]
    OutOfRange { call: &'static str, offset: u64, len: u64, size: u64 },
    #[error("{call}: {source}")]
    Engine {
        call: &'static str,
        #[source]
        source: tiermem::Error,
    },
    /// Settings that cannot work (a size that is not whole pages, limits that contradict each
    /// other, a device the tiers cannot hold); the message says which and what to change.
    #[error("{call}: {detail}")]
    Config { call: &'static str, detail: String },
    #[error("{call}: {source}")]
    Os {
        call: &'static str,
        #[source]
        source: std::io::Error,
    },
}

impl SwapError {
    /// The errno a front end answers the kernel with.
    pub fn errno(&self) -> i32 {
        match self {
            SwapError::OutOfRange { .. } => libc::EINVAL,
            SwapError::Engine { .. } | SwapError::Os { .. } => libc::EIO,
            SwapError::Config { .. } => libc::EINVAL,
        }
    }
}
