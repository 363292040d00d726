//! Fences: recorded events, shared by every chunk whose move or use they mark.
//!
//! A fence is an event recorded on a stream. Chunks hold `Arc<Fence>`s ("copy into me is
//! done", "the user's kernels are done with me"); the engine asks `is_done` (never blocks)
//! before moving a chunk and `wait`s only where it must. Events are pooled: recording a fence
//! reuses an event whose last fence has been dropped.
//!
//! A *later* fence is handed out before its event is recorded: the background file reader
//! (file_reads.rs) records it once the disk has delivered and the copy up is enqueued, or
//! marks it failed. Until then it is not done, and whoever needs its event (`event`, `wait`)
//! blocks until it is recorded — a stream must never wait on an event not yet recorded,
//! which CUDA would treat as already complete. A failed fence counts as done (nothing is in
//! flight behind it) and carries the error, for `acquire` and `finish` to report.

use crate::sync::{Arc, AtomicBool, Condvar, Done, Mutex, Ordering};
use crate::Error;
use tiermem_mechanism::{Device, EventHandle, Result, StreamHandle};

pub(crate) struct EventPool {
    device: Arc<dyn Device>,
    idle: Mutex<Vec<EventHandle>>,
}

impl EventPool {
    pub fn new(device: Arc<dyn Device>) -> Arc<Self> {
        Arc::new(Self { device, idle: Mutex::new(Vec::new()) })
    }

    /// Records a fence after the work enqueued so far on `stream`.
    pub fn record(self: &Arc<Self>, stream: StreamHandle) -> Result<Arc<Fence>> {
        let event = self.take_event()?;
        if let Err(e) = self.device.record_event(event, stream) {
            self.recycle(event);
            return Err(e);
        }
        Ok(Arc::new(Fence { event, done: AtomicBool::new(false), pool: Arc::clone(self), later: None }))
    }

    /// A fence to be recorded later, by another thread ([`Fence::record_later`] or [`Fence::fail`]).
    pub fn later(self: &Arc<Self>) -> Result<Arc<Fence>> {
        let event = self.take_event()?;
        let later = Some(Later { outcome: Mutex::new(None), recorded: Condvar::new() });
        Ok(Arc::new(Fence { event, done: AtomicBool::new(false), pool: Arc::clone(self), later }))
    }

    /// An idle event, or a new one.
    fn take_event(&self) -> Result<EventHandle> {
        let reused = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        reused.map_or_else(|| self.device.create_event(true), Ok)
    }

    fn recycle(&self, event: EventHandle) {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).push(event);
    }
}

impl Drop for EventPool {
    fn drop(&mut self) {
        for event in self.idle.get_mut().unwrap_or_else(|p| p.into_inner()).drain(..) {
            let _ = self.device.destroy_event(event);
        }
    }
}

pub(crate) struct Fence {
    event: EventHandle,
    done: AtomicBool,
    pool: Arc<EventPool>,
    later: Option<Later>,
}

/// The state of a later fence: `None` until it is recorded, then `Ok` or the failure.
struct Later {
    outcome: Mutex<Option<Result<(), Error>>>,
    recorded: Condvar,
}

impl Fence {
    /// The event, once recorded (a later fence blocks until then).
    pub fn event(&self) -> EventHandle {
        let _ = self.recorded();
        self.event
    }

    /// Blocks until the fence is recorded (at once for an ordinary fence); a later fence's
    /// failure is returned here.
    pub fn recorded(&self) -> Result<(), Error> {
        let Some(later) = &self.later else { return Ok(()) };
        let mut outcome = later.outcome.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            match &*outcome {
                Some(result) => return result.clone(),
                None => outcome = later.recorded.wait(outcome).unwrap_or_else(|p| p.into_inner()),
            }
        }
    }

    /// Whether a later fence has yet to be recorded.
    fn unrecorded(&self) -> bool {
        self.later.as_ref().is_some_and(|l| l.outcome.lock().unwrap_or_else(|p| p.into_inner()).is_none())
    }

    /// Records a later fence after the work enqueued so far on `stream` and wakes its waiters.
    /// On an error nothing is recorded: the caller fails the fence.
    pub fn record_later(&self, stream: StreamHandle) -> Result<()> {
        self.pool.device.record_event(self.event, stream)?;
        self.publish(Ok(()));
        Ok(())
    }

    /// Ends a later fence as failed: done (nothing runs behind it), carrying `error`.
    pub fn fail(&self, error: Error) {
        self.done.store(true, Ordering::Release);
        self.publish(Err(error));
    }

    /// Fails a later fence that nobody has recorded or failed yet; does nothing to one that
    /// has been. For the owner of a read that will never be served (file_reads.rs).
    pub fn fail_unless_recorded(&self, error: Error) {
        let later = self.later.as_ref().expect("only later fences are recorded later");
        let mut outcome = later.outcome.lock().unwrap_or_else(|p| p.into_inner());
        if outcome.is_none() {
            self.done.store(true, Ordering::Release);
            *outcome = Some(Err(error));
            later.recorded.notify_all();
        }
    }

    fn publish(&self, outcome: Result<(), Error>) {
        let later = self.later.as_ref().expect("only later fences are recorded later");
        *later.outcome.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
        later.recorded.notify_all();
    }

    /// Whether the fenced work has completed; caches a `true`. Never blocks.
    pub fn is_done(&self) -> Result<bool> {
        if self.done.load(Ordering::Acquire) {
            return Ok(true);
        }
        if self.unrecorded() {
            return Ok(false);
        }
        let done = self.pool.device.event_done(self.event)?;
        if done {
            self.done.store(true, Ordering::Release);
        }
        Ok(done)
    }

    /// Blocks the calling thread until the fenced work has completed (or a later fence failed:
    /// see [`Fence::recorded`]).
    pub fn wait(&self) -> Result<()> {
        let _ = self.recorded();
        if !self.done.load(Ordering::Acquire) {
            self.pool.device.synchronize_event(self.event)?;
            self.done.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Milliseconds of device time from `start` to this fence (both completed, both timing events).
    pub fn elapsed_since(&self, start: &Fence) -> Result<f32> {
        self.pool.device.elapsed_ms(start.event, self.event)
    }
}

impl Drop for Fence {
    fn drop(&mut self) {
        self.pool.recycle(self.event);
    }
}

/// One fence after every fence of `fences` that has not completed: none if all have, the
/// fence itself if one has not, else a fence recorded on `stream` after it waits for each of
/// them (on the device; the host does not wait, except for a later fence not yet recorded).
pub(crate) fn after_all(
    events: &Arc<EventPool>,
    stream: StreamHandle,
    fences: &[Arc<Fence>],
) -> Result<Option<Arc<Fence>>> {
    let mut pending: Vec<&Arc<Fence>> = Vec::new();
    for fence in fences {
        if !fence.is_done()? && !pending.iter().any(|p| Arc::ptr_eq(p, fence)) {
            pending.push(fence);
        }
    }
    match pending[..] {
        [] => Ok(None),
        [one] => Ok(Some(Arc::clone(one))),
        _ => {
            for fence in &pending {
                events.device.stream_wait_event(stream, fence.event())?;
            }
            events.record(stream).map(Some)
        }
    }
}

/// What `call` must wait for with the engine's lock released before it tries again: fences,
/// and background file writes (their [`Done`] signals), one of which it may have started
/// itself to spill the host tier (`spill`: it commits that one and reports its outcome).
#[derive(Clone)]
pub struct Waits {
    pub(crate) call: &'static str,
    pub(crate) fences: Vec<Arc<Fence>>,
    pub(crate) writes: Vec<Arc<Done>>,
    pub(crate) spill: Option<u64>,
}

impl Waits {
    /// Fences to wait for, nothing else.
    pub(crate) fn fences(call: &'static str, fences: Vec<Arc<Fence>>) -> Self {
        Self { call, fences, writes: Vec::new(), spill: None }
    }
}

impl std::fmt::Debug for Waits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (call, fences, writes) = (self.call, self.fences.len(), self.writes.len());
        write!(f, "Waits({call}: {fences} fences, {writes} file writes, spill {:?})", self.spill)
    }
}

impl PartialEq for Waits {
    fn eq(&self, other: &Self) -> bool {
        fn same<T>(a: &[Arc<T>], b: &[Arc<T>]) -> bool {
            a.len() == b.len() && a.iter().zip(b).all(|(a, b)| Arc::ptr_eq(a, b))
        }
        self.call == other.call
            && self.spill == other.spill
            && same(&self.fences, &other.fences)
            && same(&self.writes, &other.writes)
    }
}

impl Eq for Waits {}

/// Whether an optional fence is absent or completed.
pub(crate) fn settled(fence: Option<&Arc<Fence>>) -> Result<bool> {
    fence.map_or(Ok(true), |f| f.is_done())
}
