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

use crate::fence::Fence;
use crate::host_tier::Slot;
use crate::state::ChunkRef;
use crate::sync::{thread, Arc, Condvar, Mutex};
use crate::{Error, Result};
use std::collections::{BTreeMap, HashMap};
use tiermem_mechanism::file_store::{FileSlot, FileStore};

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

    /// Takes out the oldest running write that reads a slot for which `let_go(slot)` holds.
    pub(crate) fn take_oldest(&mut self, let_go: impl Fn(Slot) -> bool) -> Option<(u64, FileWrite)> {
        let ticket = *self.running.iter().find(|(_, w)| w.items.iter().any(|&(_, s, _)| let_go(s)))?.0;
        self.running.remove(&ticket).map(|write| (ticket, write))
    }

    /// Keeps the outcome of `ticket`'s write, committed before its `finish`.
    pub(crate) fn keep_outcome(&mut self, ticket: u64, outcome: Result<()>) {
        self.outcomes.insert(ticket, outcome);
    }

    /// The write of `ticket` if it still runs, else its outcome (`Ok` if it had none).
    pub(crate) fn take(&mut self, ticket: u64) -> std::result::Result<FileWrite, Result<()>> {
        match self.running.remove(&ticket) {
            Some(write) => Ok(write),
            None => Err(self.outcomes.remove(&ticket).unwrap_or(Ok(()))),
        }
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
                fence.wait().map_err(|source| Error::Device { call: "finish", source })?;
            }
            let items: Vec<(FileSlot, *const u8)> = writes.iter().map(|&(f, addr)| (f, addr as *const u8)).collect();
            // SAFETY: each source is a whole host slot (pinned, page-aligned), held so that
            // nothing is copied into it and it is not unpinned until `finish` has joined this
            // thread; the copies filling it completed above.
            unsafe { store.write(&items) }.map_err(|source| Error::File { call: "finish", source })
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
