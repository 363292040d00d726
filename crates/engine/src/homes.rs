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
//! # Handing a home over
//!
//! The holder sent home is usually the chunk the program released a step or two before, still
//! read by kernels the GPU has queued. Evicting it waited for those kernels on the host
//! (`evict_now`), which held the program's thread until the GPU caught up: on the H200's MoE
//! decode 11 ms of a 45 ms pass during which the thread queued no kernel and no copy. A
//! *clean* holder needs no copy down: its bytes are already below. So it leaves HBM at once,
//! and the chunk coming home takes its physical chunk with a copy up that waits for the
//! holder's last use **on the GPU** (the copy's stream waits for the holder's `busy` fence);
//! the holder's address keeps mapping the physical chunk, stale, as any chunk's that left.
//! Nothing the waited-for work depends on is queued after the copy (the program released the
//! holder before, and whatever that work waits for was queued before it), so no cycle forms.
//! Only where nothing else may still touch the physical chunk: the holder's arrival has landed
//! (a cancelled page-out's copy may still be filling its slot) and the incoming chunk is
//! copied up on a stream (not written by the background file reader, which waits for no
//! fence). Any other holder is evicted and waited for as before. `TIERMEM_HAND_OVER=off` waits
//! for every one.
//!
//! The holder keeps its `busy` fence after it left (`ChunkTable::leave_hbm_in_use`): its
//! address still maps the physical chunk, and whoever undoes that mapping (the holder coming
//! back elsewhere, `free`, giving the chunk back to the driver) waits for the work first, as a
//! kernel may still read through it. And the program's thread is still paced, more loosely:
//! waiting for the holder kept it within a step or two of the GPU, and nothing else does (a
//! loop that queues its kernels faster than the GPU runs them, or a test that queues none,
//! would run passes ahead, its page-ahead planning from where the GPU is not). So while the
//! chunks handed over behind work not yet done exceed half the HBM cap, the oldest such work
//! is waited for. On the H200's MoE and tied decodes this never binds: their host thread is
//! never that far ahead.
//!
//! Homes are used only while HBM is short (placement.rs, `bring_in`: at most as many holders
//! as free chunks are missing). A budget that grew leaves free room: the incoming chunks take
//! it, mapped afresh once, rather than sending holders that now fit out — which kept a loop
//! streaming whatever its budget (on the H200 a tenant alone with twice its working set paged
//! 1.7 GiB a round, as with a third of it).

use crate::engine::Inner;
use crate::error::Context;
use crate::fence::{settled, Fence};
use crate::schedule::Schedule;
use crate::state::{ChunkRef, ChunkTable, Location};
use crate::sync::Arc;
use crate::Result;
use tiermem_mechanism::PhysHandle;

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

/// Homes handed over (see "Handing a home over"): each incoming chunk with the physical chunk
/// it takes, and the fences its copy up must wait for on the GPU.
#[derive(Default)]
pub(crate) struct HandedOver {
    pub homes: Vec<(ChunkRef, PhysHandle)>,
    pub after: Vec<Arc<Fence>>,
}

impl Inner {
    /// Hands the homes of `todo` over from those of `holders` that allow it (see "Handing a
    /// home over"): each leaves HBM now, and its physical chunk goes to the chunk of `todo`
    /// coming home to it. `holders` keeps the others, to be evicted and waited for.
    pub(crate) fn hand_over_homes(
        &mut self,
        call: &'static str,
        todo: &[ChunkRef],
        holders: &mut Vec<ChunkRef>,
    ) -> Result<HandedOver> {
        self.pace_hand_overs(call, holders.len())?;
        let mut handed = HandedOver::default();
        let mut waited = Vec::with_capacity(holders.len());
        for &holder in holders.iter() {
            let chunk = self.state.chunk(holder);
            let phys = chunk.phys().expect("a holder is in HBM");
            let coming = todo.iter().copied().find(|&r| {
                let incoming = self.state.chunk(r);
                incoming.alias() == Some(phys)
                    && matches!(incoming.location(), Location::Host(_) | Location::Peer(_))
                    && !handed.homes.iter().any(|&(taken, _)| taken == r)
            });
            let Some(coming) = coming.filter(|_| chunk.copy_below().is_some()) else {
                waited.push(holder);
                continue;
            };
            if !settled(chunk.ready()).during(call)? {
                waited.push(holder);
                continue;
            }
            if let Some(busy) = chunk.busy().filter(|busy| !matches!(busy.is_done(), Ok(true))) {
                match self.handed_pending.back_mut() {
                    Some((last, chunks)) if Arc::ptr_eq(last, busy) => *chunks += 1,
                    _ => self.handed_pending.push_back((Arc::clone(busy), 1)),
                }
                if !handed.after.iter().any(|f| Arc::ptr_eq(f, busy)) {
                    handed.after.push(Arc::clone(busy));
                }
            }
            let phys = self.state.leave_hbm_in_use(holder);
            handed.homes.push((coming, phys));
        }
        let counters = &mut self.tiers.counters;
        let n = handed.homes.len() as u64;
        (counters.evictions, counters.clean_drops, counters.handed_over) =
            (counters.evictions + n, counters.clean_drops + n, counters.handed_over + n);
        *holders = waited;
        Ok(handed)
    }

    /// Waits for the oldest work homes were handed over behind while more than half the HBM
    /// cap would be handed over behind pending work with `more` chunks (see "Handing a home
    /// over"); forgets the work that is done.
    fn pace_hand_overs(&mut self, call: &'static str, more: usize) -> Result<()> {
        loop {
            while let Some((fence, _)) = self.handed_pending.front() {
                if !fence.is_done().during(call)? {
                    break;
                }
                self.handed_pending.pop_front();
            }
            let pending: usize = self.handed_pending.iter().map(|(_, chunks)| chunks).sum();
            let Some((oldest, _)) = self.handed_pending.front() else { return Ok(()) };
            if pending + more <= self.tiers.pool.cap() / 2 {
                return Ok(());
            }
            let oldest = Arc::clone(oldest);
            self.wait_for(call, vec![oldest])?;
        }
    }
}
