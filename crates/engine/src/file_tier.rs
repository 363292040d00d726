//! The file tier in the engine: spilling the host tier to the file, and paging in from it.
//!
//! Chunks reach the file only from the host tier: when the host tier is full, its coldest
//! `Host` chunks (chosen by the engine's policy) are written to the file and their host slots
//! freed; a chunk whose bytes the file already holds (`Chunk::file`) is dropped with no
//! write. `page_out_to_file` is a page-out followed by that spill for the target's chunks.
//!
//! A page-in reads `File` chunks into a pinned **staging** area of its own, not into the host
//! tier, [`STAGED_BATCHES`] transfer batches per read so that the disk has many slots to work
//! on, and copies them up from there; each batch's staging slots are freed once that batch's
//! copy has completed. The staging area holds two such groups, so the read of one group
//! overlaps the copies up of the one before. The chunk keeps its file slot: evicting it again,
//! unless it was acquired for writing, is an unmap and writes nothing.
//!
//! Reads and spills run in the calling thread (io_uring or a thread pool keeps many slots in
//! flight within each call); only the copies between staging and HBM are asynchronous. The
//! write of `page_out_to_file_start` runs in the background (file_writes.rs).

use crate::chunk::ChunkState;
use crate::engine::{ChunkRef, Inner};
use crate::error::Context;
use crate::fence::Fence;
use crate::host_tier::{HostTier, Slot};
use crate::{Error, Result};
use std::collections::VecDeque;
use std::sync::Arc;
use tiermem_mechanism::file_store::{FileSlot, FileStore};
use tiermem_policy::Candidate;

/// Transfer batches read from the file in one call.
pub(crate) const STAGED_BATCHES: usize = 4;

pub(crate) struct FileTier {
    /// Shared with background writes (file_writes.rs).
    pub store: Arc<FileStore>,
    pub staging: HostTier,
    /// Staging slots to free once the copy up reading them has completed.
    pub retiring: VecDeque<(Arc<Fence>, Slot)>,
}

impl FileTier {
    /// Frees staging slots whose copies have completed; never blocks.
    pub fn reap(&mut self) -> Result<()> {
        while let Some((fence, _)) = self.retiring.front() {
            if !fence.is_done().during("reap")? {
                break;
            }
            let (_, slot) = self.retiring.pop_front().expect("checked");
            self.staging.free(slot);
        }
        Ok(())
    }
}

fn file_error(call: &'static str) -> impl Fn(tiermem_mechanism::file_store::FileStoreError) -> Error {
    move |source| Error::File { call, source }
}

impl Inner {
    /// Reads the `File` chunks among `batch` into staging slots; `None` for the others.
    pub fn stage_from_file(&mut self, call: &'static str, batch: &[ChunkRef]) -> Result<Vec<Option<Slot>>> {
        let wanted: Vec<(usize, FileSlot)> = batch
            .iter()
            .enumerate()
            .filter_map(|(k, &r)| {
                let chunk = self.chunk_mut(r);
                matches!(chunk.state, ChunkState::File).then(|| (k, chunk.file.expect("a File chunk has a file slot")))
            })
            .collect();
        let mut staged = vec![None; batch.len()];
        if wanted.is_empty() {
            return Ok(staged);
        }
        let slots = self.staging_slots(call, wanted.len())?;
        let tier = self.file.as_mut().expect("File chunks exist only with a file tier");
        let items: Vec<(FileSlot, *mut u8)> =
            wanted.iter().zip(&slots).map(|(&(_, fslot), &s)| (fslot, tier.staging.addr(s) as *mut u8)).collect();
        // SAFETY: each destination is a whole staging slot (pinned, page-aligned, slot-sized)
        // taken just now for this read and touched by nothing else until it is freed.
        if let Err(e) = unsafe { tier.store.read(&items) } {
            slots.into_iter().for_each(|s| tier.staging.free(s));
            return Err(file_error(call)(e));
        }
        for (&(k, _), &s) in wanted.iter().zip(&slots) {
            staged[k] = Some(s);
        }
        self.counters.file_reads += wanted.len() as u64;
        Ok(staged)
    }

    /// `n` staging slots, waiting for earlier copies up to free some if need be.
    fn staging_slots(&mut self, call: &'static str, n: usize) -> Result<Vec<Slot>> {
        let device = Arc::clone(&self.device);
        let tier = self.file.as_mut().expect("staging exists with the file tier");
        loop {
            if let Some(slots) = tier.staging.alloc(device.as_ref(), n).during(call)? {
                return Ok(slots);
            }
            let Some((fence, _)) = tier.retiring.front() else {
                return Err(Error::OutOfMemory {
                    call,
                    detail: format!("{n} staging slots needed; the staging area has {}", tier.staging.cap()),
                });
            };
            fence.wait().during(call)?;
            tier.reap()?;
        }
    }

    /// Frees staging slots after `fence` (the copy up reading them), or now if there is none.
    pub fn retire_staging(&mut self, slots: Vec<Slot>, fence: Option<&Arc<Fence>>) {
        let Some(tier) = self.file.as_mut() else { return };
        for slot in slots {
            match fence {
                Some(fence) => tier.retiring.push_back((Arc::clone(fence), slot)),
                None => tier.staging.free(slot),
            }
        }
    }

    /// Makes room for `needed` host slots by spilling the coldest `Host` chunks to the file.
    /// `false` if there is no file tier or nothing to spill.
    pub fn spill_to_file(&mut self, call: &'static str, needed: usize) -> Result<bool> {
        if self.file.is_none() {
            return Ok(false);
        }
        let (mut refs, mut candidates) = (Vec::new(), Vec::new());
        for (&id, buffer) in &self.buffers {
            for (index, chunk) in buffer.chunks.iter().enumerate() {
                if let ChunkState::Host { .. } = chunk.state {
                    let key = refs.len() as u64;
                    candidates.push(Candidate {
                        key,
                        last_use: chunk.last_use,
                        clean: chunk.file.is_some(),
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
                let chunk = self.chunk_mut(r);
                match chunk.state {
                    ChunkState::Host { slot } => Some((r, slot, chunk.file)),
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
            self.chunk_mut(r).file = Some(fslot);
        }
        for (r, slot, _) in host_chunks {
            self.chunk_mut(r).state = ChunkState::File;
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
