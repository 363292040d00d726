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
//! Spills run in the calling thread (io_uring or a thread pool keeps many slots in flight
//! within each call); the write of `page_out_to_file_start` runs in the background
//! (file_writes.rs).

use crate::engine::Inner;
use crate::file_reads::FileReader;
use crate::host_tier::Slot;
use crate::state::{ChunkRef, Location};
use crate::{Error, Result};
use std::sync::Arc;
use tiermem_mechanism::file_store::{FileSlot, FileStore};
use tiermem_policy::Candidate;

pub(crate) struct FileTier {
    /// Shared with background writes (file_writes.rs) and the reader.
    pub store: Arc<FileStore>,
    pub reader: FileReader,
}

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
        let (mut refs, mut candidates) = (Vec::new(), Vec::new());
        for (id, buffer) in self.state.buffers() {
            for (index, chunk) in buffer.chunks().iter().enumerate() {
                if let Location::Host(_) = chunk.location() {
                    let key = refs.len() as u64;
                    candidates.push(Candidate {
                        key,
                        last_use: chunk.last_use(),
                        clean: chunk.file().is_some(),
                        priority: buffer.options.priority,
                        next_use: self.schedule.as_ref().and_then(|s| s.next_use(id)),
                    });
                    refs.push((id, index));
                }
            }
        }
        if candidates.is_empty() {
            return Ok(false);
        }
        let mut victims: Vec<ChunkRef> =
            self.select_victims(&candidates, needed).into_iter().map(|i| refs[i]).collect();
        victims.sort_unstable();
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
}
