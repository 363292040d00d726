//! Background file reads: a page-in from the file returns before the disk has delivered.
//!
//! Every read from the file — `page_in_start`, a schedule's `advance`, an `acquire` of a
//! chunk that lives only in the file — goes through one queue, served by one thread of the
//! file tier's own (the Bakita paper's asynchronous page-in: start, compute, finish). The
//! engine does, under its lock, only what is quick: it takes HBM, maps the chunks (they are
//! `Device` at once, as any chunk being copied up), gives them a *later* fence as their
//! `ready` fence (fence.rs) and queues a [`ReadGroup`] of up to [`GROUP_BATCHES`] transfer
//! batches. The reader reads each group into a pinned staging area of its own, many slots in
//! flight at once, enqueues the copies up on its own stream and records the group's fence.
//!
//! Because the chunks are `Device` and their fence is simply not done yet, the rest of the
//! engine needs nothing new: acquiring one makes the stream wait on the fence (blocking the
//! host only until the group's copies are enqueued), evicting or freeing one waits for it,
//! and the policy does not pick it while it arrives. The reader never takes the engine's
//! lock, so the engine may wait on a read while holding it.
//!
//! **Staging.** Two groups' worth of slots: the disk fills one group while the copy engine
//! empties the one before. A slot is reused after the fence of the copy that read it.
//!
//! **Failures.** A read that fails (I/O error, checksum mismatch, a copy refused) fails its
//! group's fence with the error, after waiting for whatever it had enqueued. The chunks'
//! bytes are still in the file, untouched: whoever sees the failure first — `acquire` or
//! `finish` — sends those chunks back to `File` and reports it, so no chunk is ever used
//! with bytes that did not arrive. A chunk evicted meanwhile goes back to `File` the usual way.
//!
//! **A panic** of the reader thread fails the group it was reading and those queued behind
//! it, as each is dropped unserved ([`ReadGroup`]'s drop), and gives the staging area and the
//! stream back as the thread unwinds; later reads fail at once, finding the queue gone. The
//! reader is not restarted: the chunks stay in the file, unreadable by this engine.

use crate::error::Context;
use crate::fence::Fence;
use crate::host_tier::{HostTier, Slot};
use crate::runs::runs;
use crate::sync::mpsc::{channel, Receiver, Sender};
use crate::sync::{thread, Arc};
use crate::{Error, Result};
use std::collections::VecDeque;
use tiermem_mechanism::file_store::{FileSlot, FileStore};
use tiermem_mechanism::{Device, DevicePtr, StreamHandle, StreamPriority};

/// Transfer batches per read group: enough slots to keep the disk busy, few enough that the
/// first chunks are usable early.
pub(crate) const GROUP_BATCHES: usize = 4;

/// Chunks to read from the file and copy up, behind one fence.
pub(crate) struct ReadGroup {
    /// The engine call that asked for them, named in errors.
    pub call: &'static str,
    /// Each chunk's file slot and the device address it is mapped at.
    pub items: Vec<(FileSlot, DevicePtr)>,
    /// Recorded after the copies up, or failed.
    pub fence: Arc<Fence>,
}

/// A group dropped before its fence was recorded or failed — the reader thread panicked while
/// reading it, or died with it still queued — fails its fence, or its chunks' waiters would
/// wait forever.
impl Drop for ReadGroup {
    fn drop(&mut self) {
        let call = self.call;
        self.fence.fail_unless_recorded(Error::Config(format!(
            "{call}: the file reader thread ended (it panicked) before these chunks were read; they stay in the file"
        )));
    }
}

/// The queue of reads and the thread that serves it.
pub(crate) struct FileReader {
    queue: Option<Sender<ReadGroup>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl FileReader {
    /// Starts the reader: a stream and a staging area for two groups of `group_chunks` chunks.
    pub fn start(device: Arc<dyn Device>, store: Arc<FileStore>, group_chunks: usize) -> Result<Self> {
        let call = "Engine::new";
        let stream = device.create_stream(StreamPriority::High).during(call)?;
        let chunk = store.slot_size();
        let worker = Worker {
            staging: HostTier::new(chunk, 2 * group_chunks * chunk),
            in_flight: VecDeque::new(),
            device: Arc::clone(&device),
            store,
            stream,
            chunk,
        };
        let (queue, groups) = channel();
        match thread::Builder::new().name("tiermem-file-read".into()).spawn(move || worker.run(groups)) {
            Ok(thread) => Ok(Self { queue: Some(queue), thread: Some(thread) }),
            Err(e) => {
                let _ = device.destroy_stream(stream);
                Err(Error::Config(format!("{call}: could not start the file reader thread: {e}")))
            }
        }
    }

    /// Queues a group; if the reader is gone, fails its fence instead.
    pub fn submit(&self, group: ReadGroup) {
        let refused = match &self.queue {
            Some(queue) => queue.send(group).err().map(|refused| refused.0),
            None => Some(group),
        };
        if let Some(group) = refused {
            group.fence.fail(Error::Config(format!("{}: the file reader thread has stopped", group.call)));
        }
    }

    /// Lets the reader finish the queued groups and waits for it.
    pub fn stop(&mut self) {
        self.queue = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for FileReader {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The reader thread's own state: nothing here is shared with the engine but the store. Its
/// drop — at the end of `run`, or while a panic unwinds the thread — gives the staging area
/// and the stream back.
struct Worker {
    device: Arc<dyn Device>,
    store: Arc<FileStore>,
    stream: StreamHandle,
    chunk: usize,
    staging: HostTier,
    /// Staging slots still read by copies up, behind their group's fence.
    in_flight: VecDeque<(Arc<Fence>, Vec<Slot>)>,
}

impl Worker {
    fn run(mut self, groups: Receiver<ReadGroup>) {
        for group in groups {
            if let Err(e) = self.read(&group) {
                group.fence.fail(e);
            }
        }
    }

    /// Reads one group into staging, enqueues its copies up and records its fence. On an error
    /// nothing it enqueued is still running and its staging slots are free again.
    fn read(&mut self, group: &ReadGroup) -> Result<()> {
        let call = group.call;
        let slots = self.staging_slots(call, group.items.len())?;
        let addr = |s: Slot| self.staging.addr(s);
        let reads: Vec<(FileSlot, *mut u8)> =
            group.items.iter().zip(&slots).map(|(&(f, _), &s)| (f, addr(s) as *mut u8)).collect();
        // SAFETY: each destination is a whole staging slot (pinned, page-aligned, slot-sized)
        // taken just now for this group; nothing else touches it until its copy's fence.
        let read = unsafe { self.store.read(&reads) }.map_err(|source| Error::File { call, source });
        let copied = read.and_then(|()| self.copy_up(group, &slots).during(call));
        if let Err(e) = copied {
            slots.into_iter().for_each(|s| self.staging.free(s));
            return Err(e);
        }
        self.in_flight.push_back((Arc::clone(&group.fence), slots));
        Ok(())
    }

    /// Enqueues the copies from staging to the chunks' addresses (one per run that is
    /// contiguous on both sides) and records the fence after them.
    fn copy_up(&self, group: &ReadGroup, slots: &[Slot]) -> tiermem_mechanism::Result<()> {
        let g = self.chunk;
        let pairs: Vec<(DevicePtr, usize)> =
            group.items.iter().zip(slots).map(|(&(_, va), &s)| (va, self.staging.addr(s))).collect();
        let continues = |first: &(DevicePtr, usize), k: usize, &(va, src): &(DevicePtr, usize)| {
            va == first.0 + (k * g) as u64 && src == first.1 + k * g
        };
        let mut outcome = Ok(());
        for (start, len) in runs(&pairs, usize::MAX, continues) {
            let (va, src) = pairs[start];
            // SAFETY: the source is this group's staging slots, freed only after the fence
            // recorded behind this copy; the destination is mapped to the chunks being read,
            // which stay in HBM until that fence.
            outcome = unsafe { self.device.copy_to_device_async(va, src, len * g, self.stream) };
            if outcome.is_err() {
                break;
            }
        }
        if outcome.is_ok() {
            outcome = group.fence.record_later(self.stream);
        }
        if outcome.is_err() {
            // Copies already enqueued must end before the staging slots are reused.
            let _ = self.device.synchronize_stream(self.stream);
        }
        outcome
    }

    /// `n` staging slots, waiting for the oldest copies up to free some if need be.
    fn staging_slots(&mut self, call: &'static str, n: usize) -> Result<Vec<Slot>> {
        loop {
            if let Some(slots) = self.staging.alloc(self.device.as_ref(), n).during(call)? {
                return Ok(slots);
            }
            let Some((fence, slots)) = self.in_flight.pop_front() else {
                return Err(Error::OutOfMemory {
                    call,
                    detail: format!("{n} staging slots needed; the staging area has {}", self.staging.cap()),
                });
            };
            let waited = fence.wait().during(call);
            slots.into_iter().for_each(|s| self.staging.free(s));
            waited?;
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Every copy out of staging is on the reader's stream: those of the groups in flight,
        // and any of a group that a panic interrupted, which no fence covers.
        let synced = self.device.synchronize_stream(self.stream);
        let released = self.staging.release_all(self.device.as_ref());
        let destroyed = self.device.destroy_stream(self.stream);
        if let Err(e) = synced.and(released).and(destroyed) {
            eprintln!("tiermem: file reader: error while releasing its staging area: {e}");
        }
    }
}
