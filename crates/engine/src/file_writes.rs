//! Background file writes: `page_out_to_file_start` returns while the disk works.
//!
//! `page_out_to_file_start` enqueues the copies out of HBM, as any page-out does, and hands
//! the file write to a thread of its own: it waits for the copies filling the host slots it
//! will write — this call's, or those of an earlier page-out still in flight — on their
//! fences, and writes the slots to freshly allocated file slots, without the
//! engine's lock — the program goes on acquiring, computing and paging meanwhile. `finish`
//! joins the thread and, under the lock, records the file copies and drops the host copies
//! (the Bakita paper's asynchronous page-out: start, then finish where the schedule needs the
//! room).
//!
//! What keeps the bytes right while the thread reads host slots the engine still owns:
//! * the slots are *held* (`HostTier::hold`): a chunk that lets its slot go meanwhile — freed,
//!   acquired for writing, spilled by host pressure — frees it only when the write is done,
//!   so nobody copies new bytes into a slot being written;
//! * at `finish`, a chunk whose slot was let go gets no file copy (its file slot is recycled):
//!   its bytes may have changed, and whoever let the slot go put them elsewhere;
//! * a write that fails leaves every chunk as it was, with its bytes in its host slot, and
//!   recycles the file slots. Nothing leaves the host tier before its file copy is written.
//!
//! A write belongs to its ticket until `finish` commits it, but anyone may have to wait for
//! it: a page-out that finds the host tier full of held slots completes the oldest such write
//! itself, under the lock (the writer never takes it), and leaves the outcome for `finish`.
//! So `finish` does not take the write out of the engine while it waits: it waits on the
//! write's [`Done`] signal with the lock released, then commits under the lock whatever
//! nobody committed meanwhile.
//!
//! Dropping the engine joins unfinished writes before it unpins anything.

use crate::engine::Inner;
use crate::fence::Fence;
use crate::host_tier::Slot;
use crate::state::{ChunkRef, Location};
use crate::sync::{thread, Arc, Condvar, Mutex};
use crate::{Error, Result};
use std::collections::{BTreeMap, HashMap};
use tiermem_mechanism::file_store::FileSlot;

/// A file write running in the background.
pub(crate) struct FileWrite {
    thread: thread::JoinHandle<Result<()>>,
    done: Arc<Done>,
    /// Each chunk written, the host slot read, the file slot written.
    items: Vec<(ChunkRef, Slot, FileSlot)>,
}

/// The background writes of unfinished tickets, by ticket, and the outcomes of those
/// completed early to make room, until their tickets are finished.
#[derive(Default)]
pub(crate) struct BackgroundWrites {
    running: BTreeMap<u64, FileWrite>,
    outcomes: HashMap<u64, Result<()>>,
}

impl BackgroundWrites {
    pub(crate) fn insert(&mut self, ticket: u64, write: FileWrite) {
        self.running.insert(ticket, write);
    }

    /// What `finish` of `ticket` waits on, with the engine's lock released; `None` if its
    /// write is already over (or it had none).
    pub(crate) fn done_signal(&self, ticket: u64) -> Option<Arc<Done>> {
        self.running.get(&ticket).map(|w| Arc::clone(&w.done))
    }

    /// Every write still running, to join at shutdown.
    pub(crate) fn take_running(&mut self) -> Vec<FileWrite> {
        std::mem::take(&mut self.running).into_values().collect()
    }
}

/// Set when a writer thread ends, however it ends (also when it panics).
#[derive(Default)]
pub(crate) struct Done {
    over: Mutex<bool>,
    changed: Condvar,
}

impl Done {
    pub(crate) fn wait(&self) {
        let mut over = self.over.lock().unwrap_or_else(|p| p.into_inner());
        while !*over {
            over = self.changed.wait(over).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Signals [`Done`] when dropped: at the end of the writer thread, or as it unwinds.
struct SignalOnDrop(Arc<Done>);

impl Drop for SignalOnDrop {
    fn drop(&mut self) {
        *self.0.over.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.0.changed.notify_all();
    }
}

impl Inner {
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
        let store = Arc::clone(&tier.store);
        let writes: Vec<(FileSlot, usize)> =
            fslots.iter().zip(&sources).map(|(&f, &(_, s))| (f, self.host.addr(s))).collect();
        let done = Arc::new(Done::default());
        let signal = SignalOnDrop(Arc::clone(&done));
        let thread = thread::Builder::new().name("tiermem-file-write".into()).spawn(move || {
            let _signal = signal;
            for fence in &fences {
                fence.wait().map_err(|source| Error::Device { call: "finish", source })?;
            }
            let items: Vec<(FileSlot, *const u8)> = writes.iter().map(|&(f, addr)| (f, addr as *const u8)).collect();
            // SAFETY: each source is a whole host slot (pinned, page-aligned), held so that
            // nothing is copied into it and it is not unpinned until `finish` has joined this
            // thread; the copies filling it completed above.
            unsafe { store.write(&items) }.map_err(|source| Error::File { call: "finish", source })
        });
        let thread = match thread {
            Ok(thread) => thread,
            Err(e) => {
                let _ = tier.store.recycle(&fslots);
                return Err(Error::Config(format!("{call}: could not start a file-write thread: {e}")));
            }
        };
        sources.iter().for_each(|&(_, s)| self.host.hold(s));
        let items = sources.into_iter().zip(fslots).map(|((r, s), f)| (r, s, f)).collect();
        Ok(Some(FileWrite { thread, done, items }))
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
}

impl Inner {
    /// Completes the oldest background write whose host slots were let go meanwhile (they
    /// come back only when it is committed), for a page-out that finds the host tier full of
    /// them. Joins the writer under the engine lock, which the writer never takes; `finish`
    /// reports the write's outcome later. `false` if there is none.
    pub(crate) fn complete_a_file_write(&mut self) -> bool {
        let host = &self.host;
        let oldest = self
            .writes
            .running
            .iter()
            .find(|(_, write)| write.items.iter().any(|&(_, s, _)| host.freed_while_held(s)))
            .map(|(&ticket, _)| ticket);
        let Some(ticket) = oldest else { return false };
        let (items, outcome) = self.writes.running.remove(&ticket).expect("found above").join();
        let committed = self.commit_file_write(items, outcome);
        self.writes.outcomes.insert(ticket, committed);
        true
    }

    /// Commits the write of `ticket` (whose [`Done`] signal is set), or returns its outcome if
    /// it was committed early; `Ok` if the ticket had no write.
    pub(crate) fn commit_write_of(&mut self, ticket: u64) -> Result<()> {
        match self.writes.running.remove(&ticket) {
            Some(write) => {
                let (items, outcome) = write.join();
                self.commit_file_write(items, outcome)
            }
            None => self.writes.outcomes.remove(&ticket).unwrap_or(Ok(())),
        }
    }
}

impl FileWrite {
    /// Waits for the write; the caller must not hold the engine's lock.
    pub(crate) fn join(self) -> (Vec<(ChunkRef, Slot, FileSlot)>, Result<()>) {
        let outcome = self.thread.join().unwrap_or_else(|_| {
            Err(Error::Config("finish: the background file write panicked; the chunks keep their host copies".into()))
        });
        (self.items, outcome)
    }
}
