//! Stable homes for streamed chunks: a loop that streams part of its buffers through HBM
//! every pass should make no driver call but the copies.
//!
//! A chunk that leaves HBM keeps its mapping, stale (`Chunk::alias`, state.rs), and costs no driver call
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
//!
//! A holder in the planned resident set (schedule.rs) is never sent out: it was streamed
//! before the plan kept it, and stays now.
//!
//! Homes are used only while HBM is short (placement.rs, `bring_in`: at most as many holders
//! as free chunks are missing). A budget that grew leaves free room: the incoming chunks take
//! it, mapped afresh once, rather than sending holders that now fit out — which kept a loop
//! streaming whatever its budget (on the H200 a tenant alone with twice its working set paged
//! 1.7 GiB a round, as with a third of it).

use crate::schedule::Schedule;
use crate::state::{ChunkRef, ChunkTable};

/// The streamed holders of the homes of `todo` (chunks about to come in) that may leave:
/// needed after `horizon` steps, not acquired, not in `protect`. Sorted.
pub(crate) fn holders_to_send_home(
    state: &ChunkTable,
    schedule: &Schedule,
    todo: &[ChunkRef],
    protect: &[ChunkRef],
    horizon: u64,
) -> Vec<ChunkRef> {
    let mut holders: Vec<ChunkRef> = todo
        .iter()
        .filter_map(|&r| state.holder(state.chunk(r).alias()?))
        .filter(|&holder| {
            let chunk = state.chunk(holder);
            let may_leave = schedule.next_use(holder.0).is_none_or(|next| next > horizon);
            chunk.streamed()
                && !schedule.is_kept(holder.0)
                && chunk.pins() == 0
                && may_leave
                && chunk.is_resident()
                && protect.binary_search(&holder).is_err()
        })
        .collect();
    holders.sort_unstable();
    holders.dedup();
    holders
}
