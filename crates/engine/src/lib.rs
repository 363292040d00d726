//! tiermem's engine: GPU buffers larger than HBM, at device addresses that never change.
//!
//! ```text
//!  Engine ── buffers (reserved VA, 2 MiB chunks) ── chunk state machine (chunk.rs)
//!     │            residency API: acquire / release / prefetch / page_in / page_out
//!     ├── movement.rs: batched, coalesced copies up and down; eviction by policy
//!     ├── schedule.rs: known step order → paging ahead, Belady eviction
//!     ├── chunk_pool.rs (HBM chunks, capped) · host_tier.rs (pinned slots, capped)
//!     ├── file_tier.rs (spills to NVMe) · file_reads.rs / file_writes.rs (in the background)
//!     └── tiermem-policy (which chunks to evict) · tiermem-mechanism (the device)
//! ```
//!
//! A program allocates buffers ([`Engine::alloc`]), gets their device pointers, and brackets
//! GPU work with [`Engine::acquire`] / [`Engine::release`] on its stream. Acquire is
//! stream-ordered: chunks not in HBM are copied in on tiermem's copy stream and the user's
//! stream waits for them on the device. Acquired chunks never move; released ones move once
//! the work before the release has completed. [`Engine::page_out`], [`Engine::page_in`] and
//! [`Engine::exchange`] (one out, another in, both directions at once) move whole buffers
//! explicitly, synchronously or with `*_start` + [`Engine::finish`] (the Bakita paper's API).

mod budget;
mod buffer;
mod chunk_pool;
mod config;
mod down;
mod engine;
mod error;
mod eviction;
mod fence;
mod file_reads;
mod file_tier;
mod file_writes;
mod homes;
mod host_tier;
mod in_flight;
mod limits;
#[cfg(all(test, feature = "shuttle"))]
mod model_checks;
mod movement;
mod residency;
mod runs;
mod schedule;
mod spill;
mod state;
mod stats;
mod sync;
mod transfers;

pub use buffer::{Access, AllocOptions, BufferId, Region};
pub use config::{format_size, parse_size, EngineConfig};
pub use engine::{Engine, Target, Ticket};
pub use error::{Error, Result};
pub use stats::{BufferStats, Counters, Stats, TierStats};
pub use tiermem_mechanism as mechanism;
pub use tiermem_mechanism::StreamHandle;
pub use tiermem_policy as policy;
