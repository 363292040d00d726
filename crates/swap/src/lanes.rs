//! Lanes: a stream and a pinned staging chunk for each engine copy in flight, so that the
//! server's threads copy to and from HBM at the same time, each on a stream of its own, from
//! memory the GPU can reach directly.
//!
//! `Engine::read` and `Engine::write` copy synchronously on the legacy stream from pageable
//! memory: the driver stages every copy through its own pinned buffer, and the legacy stream
//! orders each thread's copy behind every other's. On the H200, with eight server threads,
//! a swap write of ~320 KiB then took 0.7 ms on average. A lane's copy is: acquire the chunk on
//! the lane's stream (the stream waits for the chunk's page-in, as a kernel's would), copy
//! between the request's bytes and the lane's pinned chunk with the CPU, copy asynchronously
//! between that and HBM on the stream, wait for the stream, release.
//!
//! Lanes are created at open (streams and pinned memory are allocated once, never on the
//! request path) and handed out from a free list; a request that finds none waits.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use tiermem::mechanism::{Device, HostPtr, StreamHandle, StreamPriority};

/// One copy's resources: a stream and `size` bytes of pinned host memory.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lane {
    pub stream: StreamHandle,
    pub staging: HostPtr,
    pub size: usize,
}

/// The lanes of a store. Thread safety: `Sync`; [`Lanes::take`] blocks while none is free.
pub(crate) struct Lanes {
    device: Arc<dyn Device>,
    all: Vec<Lane>,
    free: Mutex<Vec<Lane>>,
    returned: Condvar,
}

/// A lane taken by one copy; back on the free list when dropped.
pub(crate) struct Taken<'a> {
    lanes: &'a Lanes,
    lane: Lane,
}

impl std::ops::Deref for Taken<'_> {
    type Target = Lane;
    fn deref(&self) -> &Lane {
        &self.lane
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        self.lanes.lock().push(self.lane);
        self.lanes.returned.notify_one();
    }
}

impl Lanes {
    /// `count` lanes of `size` bytes of staging each (a chunk: a copy never spans two).
    pub fn new(device: Arc<dyn Device>, count: usize, size: usize) -> tiermem::mechanism::Result<Self> {
        let mut lanes = Self { device, all: Vec::new(), free: Mutex::new(Vec::new()), returned: Condvar::new() };
        for _ in 0..count.max(1) {
            // On failure, `lanes` is dropped and frees what was made so far.
            let stream = lanes.device.create_stream(StreamPriority::High)?;
            let staging = match lanes.device.alloc_pinned(size) {
                Ok(staging) => staging,
                Err(e) => {
                    let _ = lanes.device.destroy_stream(stream);
                    return Err(e);
                }
            };
            lanes.all.push(Lane { stream, staging, size });
        }
        *lanes.lock() = lanes.all.clone();
        Ok(lanes)
    }

    pub fn device(&self) -> &dyn Device {
        self.device.as_ref()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Lane>> {
        // A free list stays consistent across a panic elsewhere: take a poisoned lock as it is.
        self.free.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A free lane, waiting for one if every lane is in use.
    pub fn take(&self) -> Taken<'_> {
        let mut free = self.lock();
        loop {
            if let Some(lane) = free.pop() {
                return Taken { lanes: self, lane };
            }
            free = self.returned.wait(free).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }
}

impl Drop for Lanes {
    /// Every `Taken` borrows the lanes, so none is in use here; each stream is synchronized
    /// by the copy that used it before the lane came back.
    fn drop(&mut self) {
        for lane in &self.all {
            let _ = self.device.destroy_stream(lane.stream);
            let _ = self.device.free_pinned(lane.staging, lane.size);
        }
    }
}
