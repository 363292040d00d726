//! A chunk's copies below HBM: the `ChunkTable` transitions that take, drop or add them.

use super::{ChunkRef, ChunkTable, Copies, InPlace};
use crate::host_tier::Slot;
use crate::peer_tier::PeerSlot;
use tiermem_mechanism::file_store::FileSlot;

impl ChunkTable {
    /// Takes chunk `r`'s copies below HBM: stale ones (it is resident and about to be
    /// written), or its only bytes (it is below HBM and discarded: discard.rs), leaving it `Empty`.
    pub fn take_copies(&mut self, r: ChunkRef) -> Copies {
        let chunk = self.at(r);
        debug_assert!(chunk.in_place == InPlace::No, "a chunk mapped in place keeps its peer slot");
        Copies { peer: chunk.peer.take(), host: chunk.host.take(), file: chunk.file.take() }
    }

    /// Gives up chunk `r`'s peer copy, which is not its only one (it is resident, or has a
    /// copy in a lower tier). Returns it.
    pub fn drop_peer_copy(&mut self, r: ChunkRef) -> Option<PeerSlot> {
        let chunk = self.at(r);
        debug_assert!(
            chunk.is_resident() || chunk.host.is_some() || chunk.file.is_some(),
            "a chunk's only copy is not a spare"
        );
        chunk.peer.take()
    }

    /// Chunk `r`'s bytes are now also in host `slot` (it had none there).
    pub fn add_host_copy(&mut self, r: ChunkRef, slot: Slot) {
        let chunk = self.at(r);
        debug_assert!(chunk.host.is_none(), "one host copy per chunk");
        chunk.host = Some(slot);
    }

    /// Gives up chunk `r`'s host copy (it is resident or in the peer tier: the copy is not its
    /// only one). Returns it.
    pub fn drop_host_copy(&mut self, r: ChunkRef) -> Option<Slot> {
        let chunk = self.at(r);
        debug_assert!(chunk.is_resident() || chunk.peer.is_some(), "only a host copy with another is a spare");
        chunk.host.take()
    }

    /// Chunk `r`'s bytes are now also in `file`.
    pub fn add_file_copy(&mut self, r: ChunkRef, file: FileSlot) {
        let chunk = self.at(r);
        debug_assert!(chunk.file.is_none(), "one file copy per chunk");
        chunk.file = Some(file);
    }

    /// Chunk `r` (located on the host, with a file copy) leaves the host tier: returns its slot.
    pub fn leave_host(&mut self, r: ChunkRef) -> Slot {
        let chunk = self.at(r);
        debug_assert!(chunk.hbm.is_none() && chunk.file.is_some(), "only a host chunk with a file copy leaves");
        chunk.host.take().expect("a host-located chunk")
    }
}
