//! Spilling to the file tier and committing background writes: the engine's side of the
//! file tier (file_tier.rs says how chunks reach the file and come back; file_writes.rs how a
//! write runs in the background).

use crate::engine::Inner;
use crate::eviction::Among;
use crate::fence::Fence;
use crate::file_writes::FileWrite;
use crate::host_tier::Slot;
use crate::state::{ChunkRef, Location};
use crate::sync::Arc;
use crate::{Error, Result};
use tiermem_mechanism::file_store::FileSlot;

fn file_error(call: &'static str) -> impl Fn(tiermem_mechanism::file_store::FileStoreError) -> Error {
    move |source| Error::File { call, source }
}

impl Inner {
    /// Makes room for `needed` host slots by spilling the coldest `Host` chunks to the file.
    /// `false` if there is no file tier or nothing to spill.
    pub fn spill_to_file(&mut self, call: &'static str, needed: usize) -> Result<bool> {
        if self.file.is_none() {
            return Ok(false);
        }
        let victims = self.victims(Among::OnHost, call, needed, &[], None)?;
        if victims.is_empty() {
            return Ok(false);
        }
        self.spill_chunks(call, &victims)?;
        Ok(true)
    }

    /// Moves the `Host` chunks among `refs` to the file: written if the file does not hold
    /// their bytes yet, then their host slots are freed. On an error nothing has moved.
    pub fn spill_chunks(&mut self, call: &'static str, refs: &[ChunkRef]) -> Result<()> {
        let host_chunks: Vec<(ChunkRef, Slot, Option<FileSlot>)> = refs
            .iter()
            .filter_map(|&r| {
                let chunk = self.state.chunk(r);
                match chunk.location() {
                    Location::Host(slot) => Some((r, slot, chunk.file())),
                    _ => None,
                }
            })
            .collect();
        let to_write: Vec<(ChunkRef, Slot)> =
            host_chunks.iter().filter(|(_, _, f)| f.is_none()).map(|&(r, s, _)| (r, s)).collect();
        let Some(tier) = self.file.as_ref() else {
            return Err(Error::Config(format!("{call}: there is no file tier (set TIERMEM_FILE)")));
        };
        let written = match to_write.len() {
            0 => Vec::new(),
            n => {
                let fslots = self.file_slots(call, n)?;
                let items: Vec<(FileSlot, *const u8)> =
                    fslots.iter().zip(&to_write).map(|(&f, &(_, s))| (f, self.host.addr(s) as *const u8)).collect();
                // SAFETY: each source is a whole host slot holding a `Host` chunk's bytes; no
                // copy touches it (the chunk is unmapped and not moving) until the write returns.
                if let Err(e) = unsafe { tier.store.write(&items) } {
                    let _ = tier.store.free(&fslots);
                    return Err(file_error(call)(e));
                }
                fslots
            }
        };
        self.counters.file_writes += written.len() as u64;
        for (&(r, _), &fslot) in to_write.iter().zip(&written) {
            self.state.add_file_copy(r, fslot);
        }
        for (r, _, _) in host_chunks {
            let slot = self.state.leave_host(r);
            self.host.free(slot);
        }
        Ok(())
    }

    /// `n` free slots of the file tier, or an error saying it is full.
    pub fn file_slots(&self, call: &'static str, n: usize) -> Result<Vec<FileSlot>> {
        let tier = self.file.as_ref().expect("the caller checked for a file tier");
        tier.store.alloc(n).ok_or_else(|| Error::OutOfMemory {
            call,
            detail: format!("{n} chunks must go to the file tier, which is full; {}", self.describe_tiers()),
        })
    }

    /// Gives file slots back for reuse (their chunks' bytes changed or were discarded). Their
    /// disk space stays allocated: rewriting a slot then overwrites blocks instead of
    /// allocating them, and the file never grows past its preallocated size anyway.
    pub fn free_file_slots(&mut self, slots: &[FileSlot]) {
        if let (Some(tier), false) = (self.file.as_ref(), slots.is_empty()) {
            // Only bad slot numbers can fail here, and these come from the store itself.
            let _ = tier.store.recycle(slots);
        }
    }

    /// Starts writing to the file the chunks of `refs` that have no file copy yet, from their
    /// host slots, once the copies filling those slots have completed (a chunk still moving
    /// down — sent by this call or an earlier one — is written after its own fence). `None` if
    /// there is nothing to write. The file slots are taken now: a full file tier is an error
    /// here, not later.
    pub(crate) fn start_file_write(&mut self, call: &'static str, refs: &[ChunkRef]) -> Result<Option<FileWrite>> {
        let mut fences: Vec<Arc<Fence>> = Vec::new();
        let sources: Vec<(ChunkRef, Slot)> = refs
            .iter()
            .filter_map(|&r| {
                let chunk = self.state.chunk(r);
                let slot = match (chunk.location(), chunk.host(), chunk.leaving()) {
                    (Location::Host(slot), _, _) => slot,
                    (Location::Hbm { leaving: true, .. }, Some(slot), Some(fence)) => {
                        if chunk.file().is_none() && !fences.iter().any(|f| Arc::ptr_eq(f, fence)) {
                            fences.push(Arc::clone(fence));
                        }
                        slot
                    }
                    _ => return None,
                };
                // A slot already held is being written by an earlier write still in flight:
                // that write gives the chunk its file copy (or, if the chunk lets the slot go
                // first, whoever spills it writes it then).
                (chunk.file().is_none() && !self.host.is_held(slot)).then_some((r, slot))
            })
            .collect();
        if sources.is_empty() {
            return Ok(None);
        }
        let fslots = self.file_slots(call, sources.len())?;
        let tier = self.file.as_ref().expect("file_slots checked");
        let writes: Vec<(FileSlot, usize)> =
            fslots.iter().zip(&sources).map(|(&f, &(_, s))| (f, self.host.addr(s))).collect();
        let items = sources.iter().zip(&fslots).map(|(&(r, s), &f)| (r, s, f)).collect();
        let write = match FileWrite::spawn(call, Arc::clone(&tier.store), fences, writes, items) {
            Ok(write) => write,
            Err(e) => {
                let _ = tier.store.recycle(&fslots);
                return Err(e);
            }
        };
        sources.iter().for_each(|&(_, s)| self.host.hold(s));
        Ok(Some(write))
    }

    /// Records the file copies of a finished write and ends its holds; on a failed write,
    /// recycles its file slots and returns the error (every chunk keeps its host copy).
    pub(crate) fn commit_file_write(
        &mut self,
        items: Vec<(ChunkRef, Slot, FileSlot)>,
        outcome: Result<()>,
    ) -> Result<()> {
        let mut unused = Vec::new();
        for &(r, slot, fslot) in &items {
            // The chunk must still hold the slot as a copy of its bytes. A chunk acquired for
            // writing lets its slot go through `retire`, which frees it only once copies
            // reading it are done: until then the slot is neither free nor the chunk's.
            let owned = outcome.is_ok() && !self.host.freed_while_held(slot) && self.state.holds_slot(r, slot);
            match owned {
                true => self.state.add_file_copy(r, fslot),
                false => unused.push(fslot),
            }
            self.host.unhold(slot);
        }
        self.counters.file_writes += (items.len() - unused.len()) as u64;
        self.free_file_slots(&unused);
        outcome
    }

    /// Completes the oldest background write whose host slots were let go meanwhile (they
    /// come back only when it is committed), for a page-out that finds the host tier full of
    /// them. Joins the writer under the engine lock, which the writer never takes; `finish`
    /// reports the write's outcome later. `false` if there is none.
    pub(crate) fn complete_a_file_write(&mut self) -> bool {
        let host = &self.host;
        let Some((ticket, write)) = self.writes.take_oldest(|slot| host.freed_while_held(slot)) else { return false };
        let (items, outcome) = write.join();
        let committed = self.commit_file_write(items, outcome);
        self.writes.keep_outcome(ticket, committed);
        true
    }

    /// Commits the write of `ticket` (whose [`Done`] signal is set), or returns its outcome if
    /// it was committed early; `Ok` if the ticket had no write.
    pub(crate) fn commit_write_of(&mut self, ticket: u64) -> Result<()> {
        match self.writes.take(ticket) {
            Ok(write) => {
                let (items, outcome) = write.join();
                self.commit_file_write(items, outcome)
            }
            Err(outcome) => outcome,
        }
    }
}
