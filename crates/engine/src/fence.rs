//! Fences: recorded events, shared by every chunk whose move or use they mark.
//!
//! A fence is an event recorded on a stream. Chunks hold `Arc<Fence>`s ("copy into me is
//! done", "the user's kernels are done with me"); the engine asks `is_done` (never blocks)
//! before moving a chunk and `wait`s only where it must. Events are pooled: recording a fence
//! reuses an event whose last fence has been dropped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
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
        let reused = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let event = match reused {
            Some(e) => e,
            None => self.device.create_event(true)?,
        };
        if let Err(e) = self.device.record_event(event, stream) {
            self.recycle(event);
            return Err(e);
        }
        Ok(Arc::new(Fence { event, done: AtomicBool::new(false), pool: Arc::clone(self) }))
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
}

impl Fence {
    pub fn event(&self) -> EventHandle {
        self.event
    }

    /// Whether the fenced work has completed; caches a `true`.
    pub fn is_done(&self) -> Result<bool> {
        if self.done.load(Ordering::Acquire) {
            return Ok(true);
        }
        let done = self.pool.device.event_done(self.event)?;
        if done {
            self.done.store(true, Ordering::Release);
        }
        Ok(done)
    }

    /// Blocks the calling thread until the fenced work has completed.
    pub fn wait(&self) -> Result<()> {
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

/// Whether an optional fence is absent or completed.
pub(crate) fn settled(fence: &Option<Arc<Fence>>) -> Result<bool> {
    fence.as_ref().map_or(Ok(true), |f| f.is_done())
}
