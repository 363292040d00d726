//! A device adaptor that counts what its users hold: every driver object created and not yet
//! given back (reservations, physical chunks, mapped granules, pinned bytes, plain
//! allocations, streams, events). It adds exactly one concern to the device it wraps, in the
//! RMM style, and works on every backend — so a leak check on the GPU counts tiermem's own
//! objects instead of guessing from the driver's free memory, which also moves with the
//! driver's private pools. A shareable allocation and an imported one are chunks like any
//! other; an exported descriptor is the caller's, and not counted.

use crate::forward::{forward_host_copies_to_inner, forward_to_inner};
use crate::{
    ChunkLocation, Device, DeviceInfo, DevicePtr, EventHandle, GpuMemory, HostPtr, PhysHandle, Result, StreamHandle,
    StreamPriority,
};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};

/// Counts of what is held through a [`CountingDevice`]; all zero once everything is back.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Held {
    pub reservations: i64,
    pub chunks: i64,
    pub mapped_granules: i64,
    pub pinned_bytes: i64,
    pub plain_allocations: i64,
    pub streams: i64,
    pub events: i64,
}

impl Held {
    pub fn is_empty(&self) -> bool {
        *self == Held::default()
    }
}

pub struct CountingDevice {
    inner: Arc<dyn Device>,
    held: Mutex<Held>,
}

impl CountingDevice {
    pub fn new(inner: Arc<dyn Device>) -> Self {
        Self { inner, held: Mutex::new(Held::default()) }
    }

    /// What is held now.
    pub fn held(&self) -> Held {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Applies `change` to the counts if `result` is a success, and passes it on.
    fn count<T>(&self, result: Result<T>, change: impl FnOnce(&mut Held)) -> Result<T> {
        if result.is_ok() {
            change(&mut self.held.lock().unwrap_or_else(|p| p.into_inner()));
        }
        result
    }

    fn granules(&self, size: usize) -> i64 {
        (size / self.inner.info().granularity.max(1)) as i64
    }
}

impl Device for CountingDevice {
    fn reserve(&self, size: usize) -> Result<DevicePtr> {
        self.count(self.inner.reserve(size), |h| h.reservations += 1)
    }
    fn unreserve(&self, va: DevicePtr, size: usize) -> Result<()> {
        self.count(self.inner.unreserve(va, size), |h| h.reservations -= 1)
    }
    fn create_chunk_at(&self, location: ChunkLocation) -> Result<PhysHandle> {
        self.count(self.inner.create_chunk_at(location), |h| h.chunks += 1)
    }
    fn release_chunk(&self, chunk: PhysHandle) -> Result<()> {
        self.count(self.inner.release_chunk(chunk), |h| h.chunks -= 1)
    }
    fn create_chunks_at(&self, location: ChunkLocation, granules: usize) -> Result<PhysHandle> {
        self.count(self.inner.create_chunks_at(location, granules), |h| h.chunks += 1)
    }
    fn create_shareable_chunks_at(&self, location: ChunkLocation, granules: usize) -> Result<PhysHandle> {
        self.count(self.inner.create_shareable_chunks_at(location, granules), |h| h.chunks += 1)
    }
    /// An import is a handle of this process like a chunk made here: held until released.
    fn import_chunk(&self, fd: BorrowedFd<'_>, size: usize) -> Result<PhysHandle> {
        self.count(self.inner.import_chunk(fd, size), |h| h.chunks += 1)
    }
    fn map_sized(&self, va: DevicePtr, chunk: PhysHandle, size: usize) -> Result<()> {
        let granules = (size / self.inner.info().granularity) as i64;
        self.count(self.inner.map_sized(va, chunk, size), |h| h.mapped_granules += granules)
    }
    fn release_mapped_chunk(&self, chunk: PhysHandle) -> Result<()> {
        self.count(self.inner.release_mapped_chunk(chunk), |h| h.chunks -= 1)
    }
    fn map(&self, va: DevicePtr, chunk: PhysHandle) -> Result<()> {
        self.count(self.inner.map(va, chunk), |h| h.mapped_granules += 1)
    }
    fn unmap(&self, va: DevicePtr, size: usize) -> Result<()> {
        let granules = self.granules(size);
        self.count(self.inner.unmap(va, size), |h| h.mapped_granules -= granules)
    }
    fn alloc_pinned(&self, size: usize) -> Result<HostPtr> {
        self.count(self.inner.alloc_pinned(size), |h| h.pinned_bytes += size as i64)
    }
    fn alloc_pinned_gently(&self, size: usize) -> Result<HostPtr> {
        self.count(self.inner.alloc_pinned_gently(size), |h| h.pinned_bytes += size as i64)
    }
    fn free_pinned(&self, ptr: HostPtr, size: usize) -> Result<()> {
        self.count(self.inner.free_pinned(ptr, size), |h| h.pinned_bytes -= size as i64)
    }
    fn create_stream(&self, priority: StreamPriority) -> Result<StreamHandle> {
        self.count(self.inner.create_stream(priority), |h| h.streams += 1)
    }
    fn destroy_stream(&self, stream: StreamHandle) -> Result<()> {
        self.count(self.inner.destroy_stream(stream), |h| h.streams -= 1)
    }
    fn create_event(&self, timing: bool) -> Result<EventHandle> {
        self.count(self.inner.create_event(timing), |h| h.events += 1)
    }
    fn destroy_event(&self, event: EventHandle) -> Result<()> {
        self.count(self.inner.destroy_event(event), |h| h.events -= 1)
    }
    forward_host_copies_to_inner!();
    fn alloc_plain(&self, size: usize) -> Result<DevicePtr> {
        self.count(self.inner.alloc_plain(size), |h| h.plain_allocations += 1)
    }
    fn free_plain(&self, ptr: DevicePtr) -> Result<()> {
        self.count(self.inner.free_plain(ptr), |h| h.plain_allocations -= 1)
    }

    forward_to_inner! {
        fn info(&self) -> &DeviceInfo;
        fn mem_info(&self) -> Result<(usize, usize)>;
        fn gpu_memory(&self, ordinal: usize) -> Result<GpuMemory>;
        fn neighbour(&self, ordinal: usize) -> Result<std::sync::Arc<dyn Device>>;
        fn export_chunk(&self, chunk: PhysHandle) -> Result<OwnedFd>;
        fn set_access_from(&self, va: DevicePtr, size: usize, gpus: &[usize]) -> Result<()>;
        fn record_event(&self, event: EventHandle, stream: StreamHandle) -> Result<()>;
        fn stream_wait_event(&self, stream: StreamHandle, event: EventHandle) -> Result<()>;
        fn event_done(&self, event: EventHandle) -> Result<bool>;
        fn synchronize_event(&self, event: EventHandle) -> Result<()>;
        fn synchronize_stream(&self, stream: StreamHandle) -> Result<()>;
        fn elapsed_ms(&self, start: EventHandle, end: EventHandle) -> Result<f32>;
        fn copy_between_devices_async(&self, dst: DevicePtr, src: DevicePtr, len: usize, stream: StreamHandle) -> Result<()>;
        fn memset_async(&self, dst: DevicePtr, value: u8, len: usize, stream: StreamHandle) -> Result<()>;
        fn fill_pattern_async(&self, dst: DevicePtr, words: usize, seed: u64, first: u64, stream: StreamHandle) -> Result<()>;
        fn check_pattern_async(&self, src: DevicePtr, words: usize, seed: u64, first: u64, counter: DevicePtr, stream: StreamHandle) -> Result<()>;
        fn write(&self, dst: DevicePtr, src: &[u8]) -> Result<()>;
        fn read(&self, src: DevicePtr, dst: &mut [u8]) -> Result<()>;
    }
}
