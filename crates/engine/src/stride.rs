//! Stride prefetch (memHarvester §4.3.2) for programs that give no schedule: after each
//! acquire, a buffer walked in one direction gets its next chunks brought in ahead of use,
//! `TIERMEM_STRIDE_PREFETCH` bytes (32 MiB by default) at a time. `policy::Stride` decides
//! from the buffer's acquires; [`Strides`] keeps one walk per buffer and says which chunks
//! come next. They come in as a prefetch does (calls.rs, `acquire`) — on the low-priority
//! stream, into free HBM only, never evicting — so a prefetch never delays the demand it runs
//! beside, and one that cannot be made (no free HBM, a driver error) is simply not made: the
//! acquire that triggered it has already succeeded. With a schedule set, `advance` pages
//! ahead instead and this stays quiet.

use crate::buffer::{BufferId, Region};
use crate::state::{ChunkRef, ChunkTable};
use std::collections::HashMap;
use tiermem_policy::Stride;

/// Each buffer's walk, and how many chunks a prefetch brings in (0: off).
pub(crate) struct Strides {
    walks: HashMap<BufferId, Stride>,
    chunks: usize,
}

impl Strides {
    pub fn new(chunks: usize) -> Self {
        Self { walks: HashMap::new(), chunks }
    }

    /// Feeds each region's buffer walk; returns, per region whose walk says so, the chunks
    /// that come next. Nothing when off.
    pub fn next_chunks(&mut self, state: &ChunkTable, regions: &[Region], chunk: usize) -> Vec<Vec<ChunkRef>> {
        if self.chunks == 0 {
            return Vec::new();
        }
        let mut wanted = Vec::new();
        for region in regions {
            let Some(buffer) = state.buffer(region.buffer) else { continue };
            let (chunks, len) = (buffer.chunks().len(), region.len.unwrap_or(buffer.size - region.offset));
            let (first, end) = (region.offset / chunk, (region.offset + len).div_ceil(chunk));
            let walk = self.walks.entry(region.buffer).or_default();
            if let Some((from, to)) = walk.observe(first, end, chunks, self.chunks) {
                wanted.push((from..to).map(|i| (region.buffer, i)).collect());
            }
        }
        wanted
    }

    /// Forgets a freed buffer's walk.
    pub fn forget(&mut self, id: BufferId) {
        self.walks.remove(&id);
    }
}
