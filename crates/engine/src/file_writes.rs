//! Background file writes: `page_out_to_file_start` returns while the disk works, and a
//! full host tier spills to the file without the engine's lock.
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
//! A *spill* is the same write, started by a call that runs through `Engine::unlocked_waits`
//! and finds the host tier full (`Inner::spill_in_background`, placement.rs): the call waits
//! for it with the lock released, then runs again, and commits it first. Committing a write
//! records the file copies and frees the host slots of the chunks it wrote that are located
//! on the host (a spill's purpose).
//!
//! What keeps the bytes right while the thread reads host slots the engine still owns:
//! * the slots are *held* (`HostTier::hold`): a chunk that lets its slot go meanwhile — freed,
//!   acquired for writing, spilled by host pressure — frees it only when the write is done,
//!   so nobody copies new bytes into a slot being written;
//! * at the commit, a chunk whose slot was let go gets no file copy (its file slot is
//!   recycled): its bytes may have changed, and whoever let the slot go put them elsewhere;
//! * a write that fails leaves every chunk as it was, with its bytes in its host slot, and
//!   recycles the file slots. Nothing leaves the host tier before its file copy is written.
//!
//! A write belongs to its [`Owner`] (a ticket, or the call that spilled) until the owner
//! commits it, but anyone may have to wait for it, and may commit it: a call that needs host
//! slots commits the writes that have ended (no waiting), waits for those holding the slots it
//! needs — with the lock released where it runs through `unlocked_waits`, else by joining the
//! oldest under the lock (the writer never takes it) — and keeps the outcome for the owner.
//! So an owner does not take its write out of the engine while it waits: it waits on the
//! write's [`Done`] signal with the lock released, then commits under the lock whatever
//! nobody committed meanwhile, or takes the outcome kept for it.
//!
//! Dropping the engine joins unfinished writes before it unpins anything.

use crate::fence::Fence;
use crate::host_tier::Slot;
use crate::state::ChunkRef;
use crate::sync::{thread, Arc, Done};
use crate::{Error, Result};
use std::collections::{BTreeMap, HashMap, HashSet};
use tiermem_mechanism::file_store::{FileSlot, FileStore};

/// A file write running in the background.
pub(crate) struct FileWrite {
    thread: thread::JoinHandle<Result<()>>,
    done: Arc<Done>,
    /// Each chunk written, the host slot read, the file slot written.
    items: Vec<(ChunkRef, Slot, FileSlot)>,
}

/// Whose a background write is: a ticket's (`page_out_to_file_start`; its `finish` commits
/// it), or a spill's, numbered (started by a call that waits with the lock released and found
/// the host tier full; that call commits it when it runs again).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Owner {
    Ticket(u64),
    Spill(u64),
}

/// The background writes not yet committed, by owner, and the outcomes of those committed
/// by someone else (to make room), until their owners ask for them.
#[derive(Default)]
pub(crate) struct BackgroundWrites {
    running: BTreeMap<Owner, FileWrite>,
    outcomes: HashMap<Owner, Result<()>>,
    /// Owners that will not ask for their outcome (a spill started by a call that does not
    /// wait for it): committed by whoever needs the room, their outcome dropped.
    abandoned: HashSet<Owner>,
    /// Spills started so far (numbered from 1).
    spills: u64,
}

impl BackgroundWrites {
    pub(crate) fn insert(&mut self, ticket: u64, write: FileWrite) {
        self.running.insert(Owner::Ticket(ticket), write);
    }

    /// Keeps the write of a spill; returns the spill's number.
    pub(crate) fn insert_spill(&mut self, write: FileWrite) -> u64 {
        self.spills += 1;
        self.running.insert(Owner::Spill(self.spills), write);
        self.spills
    }

    /// What the owner waits on, with the engine's lock released; `None` if its write is already
    /// over (or it had none).
    pub(crate) fn done_signal(&self, owner: Owner) -> Option<Arc<Done>> {
        self.running.get(&owner).map(|w| Arc::clone(&w.done))
    }

    /// The signals of the running writes that read a slot for which `read(slot)` holds.
    pub(crate) fn reading(&self, read: impl Fn(Slot) -> bool) -> Vec<Arc<Done>> {
        let writes = self.running.values().filter(|w| w.items.iter().any(|&(_, s, _)| read(s)));
        writes.map(|w| Arc::clone(&w.done)).collect()
    }

    /// Takes out the oldest running write that reads a slot for which `let_go(slot)` holds.
    pub(crate) fn take_oldest(&mut self, let_go: impl Fn(Slot) -> bool) -> Option<(Owner, FileWrite)> {
        let owner = *self.running.iter().find(|(_, w)| w.items.iter().any(|&(_, s, _)| let_go(s)))?.0;
        self.running.remove(&owner).map(|write| (owner, write))
    }

    /// Takes out every write whose thread has ended ([`Done`] set): joining them does not wait.
    pub(crate) fn take_ended(&mut self) -> Vec<(Owner, FileWrite)> {
        let ended: Vec<Owner> = self.running.iter().filter(|(_, w)| w.done.is_set()).map(|(&o, _)| o).collect();
        ended.into_iter().filter_map(|o| self.running.remove(&o).map(|w| (o, w))).collect()
    }

    /// Keeps the outcome of `owner`'s write, committed by someone else.
    pub(crate) fn keep_outcome(&mut self, owner: Owner, outcome: Result<()>) {
        if !self.abandoned.remove(&owner) {
            self.outcomes.insert(owner, outcome);
        }
    }

    /// Nobody will ask for the outcome of `owner`'s write: it is dropped once committed.
    pub(crate) fn abandon(&mut self, owner: Owner) {
        if self.outcomes.remove(&owner).is_none() && self.running.contains_key(&owner) {
            self.abandoned.insert(owner);
        }
    }

    /// The write of `owner` if it still runs, else its outcome (`Ok` if it had none).
    pub(crate) fn take(&mut self, owner: Owner) -> std::result::Result<FileWrite, Result<()>> {
        match self.running.remove(&owner) {
            Some(write) => Ok(write),
            None => Err(self.outcomes.remove(&owner).unwrap_or(Ok(()))),
        }
    }

    /// Every write still running, to join at shutdown.
    pub(crate) fn take_running(&mut self) -> Vec<FileWrite> {
        std::mem::take(&mut self.running).into_values().collect()
    }
}

/// Signals [`Done`] when dropped: at the end of the writer thread, or as it unwinds.
struct SignalOnDrop(Arc<Done>);

impl Drop for SignalOnDrop {
    fn drop(&mut self) {
        self.0.set();
    }
}

impl FileWrite {
    /// Starts a thread that waits for `fences` (the copies filling the host slots), then writes
    /// each `(file slot, host address)` of `writes`; `items` says which chunk each belongs to.
    pub(crate) fn spawn(
        call: &'static str,
        store: Arc<FileStore>,
        fences: Vec<Arc<Fence>>,
        writes: Vec<(FileSlot, usize)>,
        items: Vec<(ChunkRef, Slot, FileSlot)>,
    ) -> Result<FileWrite> {
        let done = Arc::new(Done::default());
        let signal = SignalOnDrop(Arc::clone(&done));
        let thread = thread::Builder::new().name("tiermem-file-write".into()).spawn(move || {
            let _signal = signal;
            for fence in &fences {
                fence.wait().map_err(|source| Error::Device { call, source })?;
            }
            let items: Vec<(FileSlot, *const u8)> = writes.iter().map(|&(f, addr)| (f, addr as *const u8)).collect();
            // SAFETY: each source is a whole host slot (pinned, page-aligned), held so that
            // nothing is copied into it and it is not unpinned until this thread is joined (the
            // write committed); the copies filling it completed above.
            unsafe { store.write(&items) }.map_err(|source| Error::File { call, source })
        });
        match thread {
            Ok(thread) => Ok(FileWrite { thread, done, items }),
            Err(e) => Err(Error::Config(format!("{call}: could not start a file-write thread: {e}"))),
        }
    }

    /// Waits for the write; the caller must not hold the engine's lock.
    pub(crate) fn join(self) -> (Vec<(ChunkRef, Slot, FileSlot)>, Result<()>) {
        let outcome = self.thread.join().unwrap_or_else(|_| {
            Err(Error::Config("finish: the background file write panicked; the chunks keep their host copies".into()))
        });
        (self.items, outcome)
    }
}
