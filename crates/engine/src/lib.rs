//! tiermem's engine: GPU buffers larger than HBM, at device addresses that never change.
//!
//! ```text
//!  engine.rs   the façade: Engine, the lock, waits with the lock released
//!     │
//!  calls.rs     the calls, planned: alloc / free / acquire / release / advance, tickets, budget
//!  placement.rs what comes in and what leaves: making room by policy, host slots, spills
//!     │                                  (schedule.rs: known step order, Belady; homes.rs;
//!     │                                   recorder.rs: the order learnt from a first pass)
//!  tiers.rs     the tiers and their mechanism: movement.rs (up), down.rs (down, reap, file),
//!     │         chunk_pool.rs (HBM, budgeted) · host_tier.rs · file_tier.rs, file_reads.rs,
//!     │         file_writes.rs · in_flight.rs (work in flight) · runs.rs (the coalescer)
//!  state.rs     the chunk table: the only writer of chunk state (a chunk's tiers as data)
//!     │
//!  tiermem-policy (which chunks leave) · tiermem-mechanism (the device, the file store)
//! ```
//!
//! A program allocates buffers ([`Engine::alloc`]), gets their device pointers, and brackets
//! GPU work with [`Engine::acquire`] / [`Engine::release`] on its stream. Acquire is
//! stream-ordered: chunks not in HBM are copied in on tiermem's copy stream and the user's
//! stream waits for them on the device. Acquired chunks never move; released ones move once
//! the work before the release has completed. [`Engine::page_out`], [`Engine::page_in`] and
//! [`Engine::exchange`] (one out, another in, both directions at once) move whole buffers
//! explicitly, synchronously or with `*_start` + [`Engine::finish`] (the Bakita paper's API).

mod budget_wait;
mod buffer;
mod calls;
mod candidates;
mod chunk_pool;
mod config;
mod control;
mod discard;
mod down;
mod engine;
mod error;
mod evict_room;
mod fence;
mod file_reads;
mod file_tier;
mod file_writes;
mod hand_overs;
mod homes;
mod host_budget;
mod host_tier;
mod in_flight;
mod lender_watch;
mod lenders;
mod lending_back;
mod lent;
mod limits;
#[cfg(all(test, feature = "shuttle"))]
mod model_checks;
mod movement;
mod multipath;
mod parts;
mod peer_tier;
mod peer_traffic;
mod placement;
mod pre_evict;
mod recorder;
mod runs;
mod schedule;
mod slot_runs;
mod state;
mod stats;
mod stride;
mod sync;
mod tiers;

pub use buffer::{Access, AllocOptions, BufferId, Region};
pub use config::{format_size, parse_size, EngineConfig, HbmLimit, PeerChoice, DEFAULT_CHUNK};
pub use engine::{Engine, Target, Ticket};
pub use error::{Error, Result};
pub use host_budget::HOST_FLOOR;
pub use lenders::{peer_lending, recap as lending_recap, Lending as PeerLending};
pub use stats::{BufferStats, Counters, PerTier, Stats, TierStats};
pub use tiermem_mechanism as mechanism;
pub use tiermem_mechanism::StreamHandle;
pub use tiermem_policy as policy;
pub use tiermem_policy::Tier;
