//! Stride prefetch (memHarvester §4.3.2) for programs that give no schedule: after each
//! acquire, a buffer walked in one direction gets its next chunks brought in ahead of use,
//! `TIERMEM_STRIDE_PREFETCH` bytes (32 MiB by default) at a time. `policy::Stride` decides
//! from the buffer's acquires; the chunks come in as a prefetch does — on the low-priority
//! stream, into free HBM only, never evicting — so a prefetch never delays the demand it runs
//! beside, and one that cannot be made (no free HBM, a driver error) is simply not made: the
//! acquire that triggered it has already succeeded. With a schedule set, `advance` pages
//! ahead instead and this stays quiet.

use crate::buffer::Region;
use crate::engine::Inner;
use crate::movement::Purpose;
use crate::state::ChunkRef;

impl Inner {
    /// Feeds each region's buffer walk and prefetches what it says comes next.
    pub(crate) fn prefetch_strides(&mut self, regions: &[Region]) {
        if self.stride_chunks == 0 || self.schedule.is_some() {
            return;
        }
        let g = self.tiers.chunk;
        for region in regions {
            let Some(buffer) = self.state.buffer(region.buffer) else { continue };
            let (chunks, len) = (buffer.chunks().len(), region.len.unwrap_or(buffer.size - region.offset));
            let (first, end) = (region.offset / g, (region.offset + len).div_ceil(g));
            let walk = self.strides.entry(region.buffer).or_default();
            let Some((from, to)) = walk.observe(first, end, chunks, self.stride_chunks) else { continue };
            let wanted: Vec<ChunkRef> = (from..to).map(|i| (region.buffer, i)).collect();
            if self.tiers.pool.available() > 0 {
                // Best effort: the acquire stands whatever happens here.
                let _ = self.bring_in("stride prefetch", &wanted, Purpose::Prefetch);
            }
        }
    }
}
