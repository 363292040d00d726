//! The tiers and the machinery that moves chunks between them: the device, HBM's physical
//! chunks (the budgeted pool), HBM lent by neighbour GPUs (the peer tier), the pinned host tier, the file tier with its background writes,
//! the copy streams and the index of work in flight, and the transfer counters.
//!
//! [`Tiers`] is the mechanism of movement: it maps, copies, records fences, and commits what
//! has landed, taking the chunk table (state.rs) as a narrow borrow for each move — its
//! methods live in movement.rs (up), down.rs (down, reaping what landed, giving HBM back) and,
//! for the file tier, file_tier.rs. It decides nothing: which chunks move, and where to, is
//! the engine's planning (calls.rs, placement.rs), under the policy.

use crate::chunk_pool::ChunkPool;
use crate::fence::EventPool;
use crate::file_tier::FileTier;
use crate::file_writes::BackgroundWrites;
use crate::host_tier::HostTier;
use crate::in_flight::InFlight;
use crate::multipath::Multipath;
use crate::peer_tier::PeerTier;
use crate::stats::Counters;
use crate::sync::Arc;
use tiermem_mechanism::{Device, StreamHandle};

/// tiermem's copy streams: `up` for demand, `prefetch` (low priority) for paging ahead,
/// `down` for page-outs, so the two directions overlap on the two copy engines.
pub(crate) struct Streams {
    pub up: StreamHandle,
    pub down: StreamHandle,
    pub prefetch: StreamHandle,
}

pub(crate) struct Tiers {
    pub device: Arc<dyn Device>,
    /// The size of a chunk (the device's VMM granularity).
    pub chunk: usize,
    /// The most chunks mapped with one `cuMemSetAccess`.
    pub batch: usize,
    /// HBM: physical chunks, capped by the budget (chunk_pool.rs; calls.rs, "The HBM budget").
    pub pool: ChunkPool,
    /// HBM lent by neighbour GPUs (peer_tier.rs); without lenders, a tier of no slot.
    pub peer: PeerTier,
    /// The lenders' PCIe links, a second path for page-ins from the host tier (multipath.rs).
    pub multipath: Multipath,
    pub host: HostTier,
    pub file: Option<FileTier>,
    /// The background file writes of tickets (file_writes.rs).
    pub writes: BackgroundWrites,
    pub events: Arc<EventPool>,
    pub streams: Streams,
    /// Moves down, slots still read by copies, demand copies being timed (in_flight.rs).
    pub in_flight: InFlight,
    pub counters: Counters,
}
