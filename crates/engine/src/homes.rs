//! Stable homes for streamed chunks: a loop that streams part of its buffers through HBM
//! every pass should make no driver call but the copies.
//!
//! A chunk that leaves HBM keeps its mapping, stale (`Chunk::alias`), and costs no driver call
//! when it comes back to the same physical chunk. But Belady alone hands each incoming chunk
//! the physical chunk of the chunk just evicted for it — in a loop, the one used just before —
//! and unless the streamed bytes are a multiple of the window, that is a different physical
//! chunk every pass. Every streamed chunk is then unmapped and mapped afresh every pass:
//! ~100 µs of driver time on the H200 while kernels run, more than its 38 µs copy.
//!
//! So before Belady picks victims, an incoming chunk whose old physical chunk (its *home*) is
//! held by another chunk sends that holder out, if the holder
//! * streams too — it has been evicted since the schedule was set, so it will not stay
//!   resident until its next use whatever we do, and evicting it now moves no extra bytes;
//! * is needed later than the incoming chunk's step (`horizon`), as any victim must be;
//! * is not acquired and not among the chunks being brought in.
//!
//! Each such eviction is a swap (one chunk in, one out), so the resident set Belady keeps is
//! never eroded: chunks that were never evicted are never holders sent home. Once a pass has
//! settled, the streamed chunks share their homes in fixed chains and a pass maps nothing.
//! A holder that may not leave (needed sooner, or acquired) leaves its home taken: the
//! incoming chunk gets whatever Belady frees and maps afresh, as before.

use crate::engine::Inner;
use crate::state::ChunkRef;
use crate::Result;

impl Inner {
    /// Evicts the streamed holders of the homes of `todo` (chunks about to come in) that may
    /// leave: needed after `horizon` steps, not acquired, not in `protect`.
    pub(crate) fn send_holders_home(
        &mut self,
        call: &'static str,
        todo: &[ChunkRef],
        protect: &[ChunkRef],
        horizon: u64,
    ) -> Result<()> {
        let schedule = self.schedule.as_ref().expect("homes matter only with a schedule");
        let mut holders: Vec<ChunkRef> = todo
            .iter()
            .filter_map(|&r| self.state.holder(self.state.chunk(r).alias()?))
            .filter(|&holder| {
                let chunk = self.state.chunk(holder);
                let may_leave = schedule.next_use(holder.0).is_none_or(|next| next > horizon);
                chunk.streamed()
                    && chunk.pins() == 0
                    && may_leave
                    && chunk.is_resident()
                    && protect.binary_search(&holder).is_err()
            })
            .collect();
        if holders.is_empty() {
            return Ok(());
        }
        holders.sort_unstable();
        holders.dedup();
        self.evict_now(call, &holders)
    }
}
