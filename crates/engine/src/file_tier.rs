//! The file tier in the engine: spilling the host tier to the file, and paging in from it.
//!
//! Chunks reach the file only from the host tier: when the host tier is full, its coldest
//! `Host` chunks (chosen by the engine's policy) are written to the file and their host slots
//! freed; a chunk whose bytes the file already holds (`Chunk::file`) is dropped with no
//! write. `page_out_to_file` is a page-out followed by that spill for the target's chunks.
//!
//! A page-in from the file goes through the background reader (file_reads.rs): into a pinned
//! staging area of the reader's own, not into the host tier, and up from there; the call
//! returns once the chunks are mapped and their reads queued. The chunk keeps its file slot:
//! evicting it again, unless it was acquired for writing, writes nothing.
//!
//! A spill by a call that waits with the lock released (`Engine::unlocked_waits`: acquire,
//! write, read, page-in, advance, page-out) runs in the background, as the write of
//! `page_out_to_file_start` does (file_writes.rs); the other calls spill in the calling
//! thread, under the lock. Either way io_uring or a thread pool keeps many slots in flight.

use crate::error::Context;
use crate::fence::Fence;
use crate::file_reads::FileReader;
use crate::file_writes::{FileWrite, Owner};
use crate::host_tier::Slot;
use crate::state::{ChunkRef, ChunkTable, Location};
use crate::tiers::Tiers;
use crate::{EngineConfig, Error, Result};
use std::sync::Arc;
use tiermem_mechanism::file_store::FileSlot;
use tiermem_mechanism::file_store::{FileStore, FileStoreConfig};
use tiermem_mechanism::Device;

pub(crate) struct FileTier {
    /// Shared with background writes (file_writes.rs) and the reader.
    pub store: Arc<FileStore>,
    pub reader: FileReader,
}

impl FileTier {
    /// Creates the file tier's store (one slot per chunk) and its background reader.
    pub fn open(device: &Arc<dyn Device>, config: &EngineConfig, path: &std::path::Path, chunk: usize) -> Result<Self> {
        let store = FileStore::open(FileStoreConfig {
            path: path.to_owned(),
            capacity: config.file_limit / chunk * chunk,
            slot_size: chunk,
            queue_depth: config.file_queue_depth.max(1),
            io: config.file_io,
        })
        .map_err(|source| Error::File { call: "Engine::new", source })?;
        let store = Arc::new(store);
        let group_chunks = crate::file_reads::GROUP_BATCHES * config.batch_chunks.max(1);
        let reader = FileReader::start(Arc::clone(device), Arc::clone(&store), group_chunks)?;
        Ok(FileTier { store, reader })
    }
}

fn file_error(call: &'static str) -> impl Fn(tiermem_mechanism::file_store::FileStoreError) -> Error {
    move |source| Error::File { call, source }
}

impl Tiers {
    /// Moves the `Host` chunks among `refs` to the file: written if the file does not hold
    /// their bytes yet, then their host slots are freed. On an error nothing has moved.
    pub fn spill_chunks(&mut self, state: &mut ChunkTable, call: &'static str, refs: &[ChunkRef]) -> Result<()> {
        let host_chunks: Vec<(ChunkRef, Slot, Option<FileSlot>)> = refs
            .iter()
            .filter_map(|&r| {
                let chunk = state.chunk(r);
                match chunk.location() {
                    Location::Host(slot) => Some((r, slot, chunk.file())),
                    _ => None,
                }
            })
            .collect();
        let to_write: Vec<(ChunkRef, Slot)> =
            host_chunks.iter().filter(|(_, _, f)| f.is_none()).map(|&(r, s, _)| (r, s)).collect();
        // A slot still filled by a copy down that handed its HBM over (state.rs, `landing`).
        for landing in to_write.iter().filter_map(|&(r, _)| state.chunk(r).landing()) {
            landing.wait().during(call)?;
        }
        let Some(tier) = self.file.as_ref() else {
            return Err(Error::Config(format!("{call}: there is no file tier (set TIERMEM_FILE)")));
        };
        let written = match to_write.len() {
            0 => Vec::new(),
            n => {
                let fslots = self.file_slots(state, call, n)?;
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
            state.add_file_copy(r, fslot);
        }
        for (r, _, _) in host_chunks {
            let slot = state.leave_host(r);
            self.host.free(slot);
        }
        Ok(())
    }

    /// `n` free slots of the file tier, or an error saying it is full.
    pub fn file_slots(&self, state: &ChunkTable, call: &'static str, n: usize) -> Result<Vec<FileSlot>> {
        let tier = self.file.as_ref().expect("the caller checked for a file tier");
        tier.store.alloc(n).ok_or_else(|| Error::OutOfMemory {
            call,
            detail: format!("{n} chunks must go to the file tier, which is full; {}", self.describe_tiers(state)),
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
    pub(crate) fn start_file_write(
        &mut self,
        state: &mut ChunkTable,
        call: &'static str,
        refs: &[ChunkRef],
    ) -> Result<Option<FileWrite>> {
        let mut fences: Vec<Arc<Fence>> = Vec::new();
        let sources: Vec<(ChunkRef, Slot)> = refs
            .iter()
            .filter_map(|&r| {
                let chunk = state.chunk(r);
                // A slot still being filled: by the chunk's move down (leaving, or handed over
                // and `landing`, state.rs), written after its fence.
                let filling = chunk.leaving().or(chunk.landing());
                let slot = match (chunk.location(), chunk.host()) {
                    (Location::Host(slot), _) | (Location::Hbm { leaving: true, .. }, Some(slot)) => slot,
                    _ => return None,
                };
                if let Some(fence) = filling.filter(|_| chunk.file().is_none()) {
                    if !fences.iter().any(|f| Arc::ptr_eq(f, fence)) {
                        fences.push(Arc::clone(fence));
                    }
                }
                // A slot already held is being written by an earlier write still in flight:
                // that write gives the chunk its file copy (or, if the chunk lets the slot go
                // first, whoever spills it writes it then).
                (chunk.file().is_none() && !self.host.is_held(slot)).then_some((r, slot))
            })
            .collect();
        if sources.is_empty() {
            return Ok(None);
        }
        let fslots = self.file_slots(state, call, sources.len())?;
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
        state: &mut ChunkTable,
        items: Vec<(ChunkRef, Slot, FileSlot)>,
        outcome: Result<()>,
    ) -> Result<()> {
        let mut unused = Vec::new();
        for &(r, slot, fslot) in &items {
            // The chunk must still hold the slot as a copy of its bytes. A chunk acquired for
            // writing lets its slot go through `retire`, which frees it only once copies
            // reading it are done: until then the slot is neither free nor the chunk's.
            let owned = outcome.is_ok() && !self.host.freed_while_held(slot) && state.holds_slot(r, slot);
            match owned {
                true => state.add_file_copy(r, fslot),
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
    /// them. Joins the writer under the engine lock, which the writer never takes; the write's
    /// owner gets the outcome later. `false` if there is none.
    pub(crate) fn complete_a_file_write(&mut self, state: &mut ChunkTable) -> bool {
        let host = &self.host;
        let Some((owner, write)) = self.writes.take_oldest(|slot| host.freed_while_held(slot)) else { return false };
        let committed = self.commit_write(state, write);
        self.writes.keep_outcome(owner, committed);
        true
    }

    /// Commits, without waiting, the background writes whose threads have ended, keeping their
    /// outcomes for their owners. `false` if there were none.
    pub(crate) fn commit_ended_writes(&mut self, state: &mut ChunkTable) -> bool {
        let ended = self.writes.take_ended();
        let any = !ended.is_empty();
        for (owner, write) in ended {
            let committed = self.commit_write(state, write);
            self.writes.keep_outcome(owner, committed);
        }
        any
    }

    /// Commits the write of `owner` (whose [`Done`] signal is set), or returns its outcome if
    /// someone else committed it; `Ok` if it had none.
    pub(crate) fn commit_write_of(&mut self, state: &mut ChunkTable, owner: Owner) -> Result<()> {
        match self.writes.take(owner) {
            Ok(write) => self.commit_write(state, write),
            Err(outcome) => outcome,
        }
    }

    /// Joins a write (at once if its thread has ended) and commits it; then the chunks it gave a
    /// file copy that are located on the host leave the host tier, as a spill's do.
    fn commit_write(&mut self, state: &mut ChunkTable, write: FileWrite) -> Result<()> {
        let (items, outcome) = write.join();
        let written: Vec<(ChunkRef, Slot)> = items.iter().map(|&(r, slot, _)| (r, slot)).collect();
        let committed = self.commit_file_write(state, items, outcome);
        for (r, slot) in written {
            let on_host = |c: &crate::state::Chunk| c.location() == Location::Host(slot) && c.file().is_some();
            if state.buffer(r.0).is_some() && on_host(state.chunk(r)) {
                let slot = state.leave_host(r);
                self.host.free(slot);
            }
        }
        committed
    }
}
