//! Discarding: bytes a program no longer wants give their memory back without being copied
//! anywhere — activations once backward has read them, a scratch buffer between its uses.
//!
//! [`crate::Engine::discard`] drops the chunks wholly inside its regions. A resident chunk's
//! copies below HBM are freed (a slot that a page-in still reads, once that copy is done) and
//! it leaves HBM the way a clean chunk does: at once, or behind the work that may still touch
//! it, with nothing copied down. A chunk below HBM gives its slots up. Either way it ends
//! `Empty` (state.rs), so its next acquire makes it resident as zeros, with no page-in: a
//! buffer reused every step and written afresh each time never brings its dead bytes back
//! over the link, and never sends them down.
//!
//! It is advice about bytes, not a move, and it never waits. What it cannot drop without
//! waiting — a chunk moving down, one mapped in place in a neighbour's HBM, or one whose
//! page-in may still be reading its file copy — keeps its bytes, as does a chunk only partly
//! inside a region. So after a discard the region's bytes are undefined until written (zeros,
//! or what they were). An acquired chunk is an error, as for `free`.

use crate::buffer::Region;
use crate::engine::Inner;
use crate::state::{ChunkRef, Location};
use crate::{Error, Result};

impl Inner {
    /// Drops the bytes of the chunks wholly inside `regions` (see above); returns how many
    /// chunks gave their memory up.
    pub(crate) fn discard(&mut self, regions: &[Region]) -> Result<usize> {
        let refs = self.whole_chunks("discard", regions)?;
        if let Some(&(buffer, _)) = refs.iter().find(|&&r| self.state.chunk(r).pins() > 0) {
            let pinned_chunks = refs.iter().filter(|&&r| r.0 == buffer && self.state.chunk(r).pins() > 0).count();
            return Err(Error::Acquired { call: "discard", buffer, pinned_chunks });
        }
        self.tiers.reap(&mut self.state)?;
        let (mut resident, mut below) = (Vec::new(), 0);
        for r in refs {
            let chunk = self.state.chunk(r);
            if chunk.leaving().is_some() || chunk.maps_in_place() || chunk.location() == Location::Empty {
                continue;
            }
            // A resident chunk's page-in may still be reading a slot below; below HBM nothing
            // reads its slots (a page-in would have made it resident, and a write of its host
            // slot to the file is committed only if the chunk still holds it), but a chunk that
            // handed its HBM over may still be filling its slot (`landing`).
            let reader =
                chunk.ready().or(chunk.landing()).cloned().filter(|fence| !matches!(fence.is_done(), Ok(true)));
            if reader.is_some() && chunk.file().is_some() {
                continue; // its page-in may be reading the file copy still
            }
            match chunk.is_resident() {
                true => resident.push(r),
                false => below += 1,
            }
            let copies = self.state.take_copies(r);
            self.tiers.give_up(copies, reader);
        }
        self.tiers.leave_without_copy(&mut self.state, "discard", &resident)?;
        let dropped = resident.len() + below;
        self.tiers.counters.discarded += dropped as u64;
        Ok(dropped)
    }

    /// The chunks wholly inside one of `regions` (the last chunk of a buffer counts as whole
    /// when a region reaches the buffer's end), sorted; validates every region first.
    fn whole_chunks(&self, call: &'static str, regions: &[Region]) -> Result<Vec<ChunkRef>> {
        self.resolve(call, regions)?;
        let chunk = self.tiers.chunk;
        let mut refs = Vec::new();
        for region in regions {
            let size = self.buffer(call, region.buffer)?.size;
            let end = region.len.map_or(size, |len| region.offset + len);
            let last = if end == size { size.div_ceil(chunk) } else { end / chunk };
            refs.extend((region.offset.div_ceil(chunk)..last).map(|index| (region.buffer, index)));
        }
        refs.sort_unstable();
        refs.dedup();
        Ok(refs)
    }
}
