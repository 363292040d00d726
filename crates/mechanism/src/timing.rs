//! A device adaptor that times driver calls: the wall time the host spends in each kind of
//! call that manages memory (reserving address space, creating and releasing physical chunks,
//! mapping, setting access, unmapping, pinning host memory), added up since the adaptor was
//! made. It adds exactly one concern to the device it wraps, in the RMM style (like
//! counting.rs), and works on every backend, so the engine's statistics (`map_ms`,
//! `unmap_ms`) come from one place instead of timers around each call site.
//!
//! Copies, events and stream calls are passed on untimed: they are asynchronous (their cost is
//! device time, which the engine measures with events) or waits (which the engine times where
//! it waits, as a wait and not as a driver call). So is `export_chunk`, made once per
//! allocation handed to another process, not on any path the engine's statistics describe.
//!
//! Thread safety: every call may come from any thread; the totals are lock-free atomics.
//! A failed call is counted and timed like one that succeeded (it took the time). A snapshot
//! ([`TimedDevice::times`]) reads each total on its own, so a call completing meanwhile may
//! be in its count but not yet in its time.

use crate::forward::{forward_host_copies_to_inner, forward_to_inner};
use crate::{
    ChunkLocation, Device, DeviceInfo, DevicePtr, EventHandle, GpuMemory, HostPtr, PhysHandle, Result, StreamHandle,
    StreamPriority,
};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// The kinds of driver call a [`TimedDevice`] times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Reserve,
    Unreserve,
    CreateChunk,
    ReleaseChunk,
    Map,
    SetAccess,
    Unmap,
    AllocPinned,
    FreePinned,
}

const KINDS: usize = Call::FreePinned as usize + 1;

/// The calls of one kind and the wall time spent in them.
#[derive(Debug, Default, Clone, Copy, PartialEq, serde::Serialize)]
pub struct CallTime {
    pub calls: u64,
    pub ms: f64,
}

/// Wall time spent in each kind of driver call through a [`TimedDevice`] since it was made.
#[derive(Debug, Default, Clone, PartialEq, serde::Serialize)]
pub struct DriverTimes {
    /// `cuMemAddressReserve`.
    pub reserve: CallTime,
    /// `cuMemAddressFree`.
    pub unreserve: CallTime,
    /// `cuMemCreate`: one physical chunk each, at any location (`create_chunk_at`), or one
    /// allocation (`create_chunks_at`, `create_shareable_chunks_at`); and
    /// `cuMemImportFromShareableHandle`, which makes a handle as well (`import_chunk`).
    pub create_chunk: CallTime,
    /// `cuMemRelease`.
    pub release_chunk: CallTime,
    /// `cuMemMap`: one chunk each.
    pub map: CallTime,
    /// `cuMemSetAccess`: one range of mapped chunks each, for one GPU or several (`set_access_from`).
    pub set_access: CallTime,
    /// `cuMemUnmap`: one range of mapped chunks each.
    pub unmap: CallTime,
    /// `cuMemHostAlloc` (pinned host memory).
    pub alloc_pinned: CallTime,
    /// `cuMemFreeHost`.
    pub free_pinned: CallTime,
}

#[derive(Default)]
struct Tally {
    calls: AtomicU64,
    nanos: AtomicU64,
}

impl Tally {
    fn read(&self) -> CallTime {
        let nanos = self.nanos.load(Ordering::Relaxed);
        CallTime { calls: self.calls.load(Ordering::Relaxed), ms: nanos as f64 / 1e6 }
    }
}

/// A [`Device`] that passes every call on to the device it wraps and adds up the wall time
/// of the memory-management calls ([`DriverTimes`]).
pub struct TimedDevice {
    inner: Arc<dyn Device>,
    tallies: [Tally; KINDS],
}

impl TimedDevice {
    pub fn new(inner: Arc<dyn Device>) -> Self {
        Self { inner, tallies: Default::default() }
    }

    /// The totals so far (see the module docs for what a snapshot may miss).
    pub fn times(&self) -> DriverTimes {
        let t = |call: Call| self.tallies[call as usize].read();
        DriverTimes {
            reserve: t(Call::Reserve),
            unreserve: t(Call::Unreserve),
            create_chunk: t(Call::CreateChunk),
            release_chunk: t(Call::ReleaseChunk),
            map: t(Call::Map),
            set_access: t(Call::SetAccess),
            unmap: t(Call::Unmap),
            alloc_pinned: t(Call::AllocPinned),
            free_pinned: t(Call::FreePinned),
        }
    }

    /// Runs `call` and adds its wall time to the tally of `kind`.
    fn timed<T>(&self, kind: Call, call: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let outcome = call();
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let tally = &self.tallies[kind as usize];
        tally.nanos.fetch_add(nanos, Ordering::Relaxed);
        tally.calls.fetch_add(1, Ordering::Relaxed);
        outcome
    }
}

impl Device for TimedDevice {
    fn reserve(&self, size: usize) -> Result<DevicePtr> {
        self.timed(Call::Reserve, || self.inner.reserve(size))
    }
    fn unreserve(&self, va: DevicePtr, size: usize) -> Result<()> {
        self.timed(Call::Unreserve, || self.inner.unreserve(va, size))
    }
    fn create_chunk_at(&self, location: ChunkLocation) -> Result<PhysHandle> {
        self.timed(Call::CreateChunk, || self.inner.create_chunk_at(location))
    }
    fn release_chunk(&self, chunk: PhysHandle) -> Result<()> {
        self.timed(Call::ReleaseChunk, || self.inner.release_chunk(chunk))
    }
    fn create_chunks_at(&self, location: ChunkLocation, granules: usize) -> Result<PhysHandle> {
        self.timed(Call::CreateChunk, || self.inner.create_chunks_at(location, granules))
    }
    fn create_shareable_chunks_at(&self, location: ChunkLocation, granules: usize) -> Result<PhysHandle> {
        self.timed(Call::CreateChunk, || self.inner.create_shareable_chunks_at(location, granules))
    }
    fn import_chunk(&self, fd: BorrowedFd<'_>, size: usize) -> Result<PhysHandle> {
        self.timed(Call::CreateChunk, || self.inner.import_chunk(fd, size))
    }
    fn map_sized(&self, va: DevicePtr, chunk: PhysHandle, size: usize) -> Result<()> {
        self.timed(Call::Map, || self.inner.map_sized(va, chunk, size))
    }
    fn release_mapped_chunk(&self, chunk: PhysHandle) -> Result<()> {
        self.timed(Call::ReleaseChunk, || self.inner.release_mapped_chunk(chunk))
    }
    fn map(&self, va: DevicePtr, chunk: PhysHandle) -> Result<()> {
        self.timed(Call::Map, || self.inner.map(va, chunk))
    }
    fn set_access_from(&self, va: DevicePtr, size: usize, gpus: &[usize]) -> Result<()> {
        self.timed(Call::SetAccess, || self.inner.set_access_from(va, size, gpus))
    }
    fn unmap(&self, va: DevicePtr, size: usize) -> Result<()> {
        self.timed(Call::Unmap, || self.inner.unmap(va, size))
    }
    fn alloc_pinned(&self, size: usize) -> Result<HostPtr> {
        self.timed(Call::AllocPinned, || self.inner.alloc_pinned(size))
    }
    fn alloc_pinned_gently(&self, size: usize) -> Result<HostPtr> {
        self.timed(Call::AllocPinned, || self.inner.alloc_pinned_gently(size))
    }
    fn free_pinned(&self, ptr: HostPtr, size: usize) -> Result<()> {
        self.timed(Call::FreePinned, || self.inner.free_pinned(ptr, size))
    }
    forward_host_copies_to_inner!();
    fn free_plain(&self, ptr: DevicePtr) -> Result<()> {
        self.inner.free_plain(ptr)
    }

    forward_to_inner! {
        fn info(&self) -> &DeviceInfo;
        fn mem_info(&self) -> Result<(usize, usize)>;
        fn gpu_memory(&self, ordinal: usize) -> Result<GpuMemory>;
        fn neighbour(&self, ordinal: usize) -> Result<std::sync::Arc<dyn Device>>;
        fn export_chunk(&self, chunk: PhysHandle) -> Result<OwnedFd>;
        fn create_stream(&self, priority: StreamPriority) -> Result<StreamHandle>;
        fn destroy_stream(&self, stream: StreamHandle) -> Result<()>;
        fn create_event(&self, timing: bool) -> Result<EventHandle>;
        fn destroy_event(&self, event: EventHandle) -> Result<()>;
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
        fn alloc_plain(&self, size: usize) -> Result<DevicePtr>;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::SimDevice;

    const G: usize = 2 << 20;

    fn timed_sim(chunks: usize) -> (TimedDevice, Arc<SimDevice>) {
        let sim = Arc::new(SimDevice::new(chunks * G).expect("simulated device"));
        let device: Arc<dyn Device> = sim.clone();
        (TimedDevice::new(device), sim)
    }

    #[test]
    fn every_memory_call_is_counted_once_and_the_rest_pass_through_untimed() {
        let (timed, sim) = timed_sim(4);
        let va = timed.reserve(2 * G).unwrap();
        let chunks = [timed.create_chunk().unwrap(), timed.create_chunk().unwrap()];
        for (i, &chunk) in chunks.iter().enumerate() {
            timed.map(va + (i * G) as u64, chunk).unwrap();
        }
        timed.set_access(va, 2 * G).unwrap();
        timed.write(va + 5, b"timed").unwrap();
        let mut back = [0u8; 5];
        timed.read(va + 5, &mut back).unwrap();
        assert_eq!(&back, b"timed", "calls pass through to the device");
        timed.unmap(va, 2 * G).unwrap();
        chunks.into_iter().for_each(|c| timed.release_chunk(c).unwrap());
        timed.unreserve(va, 2 * G).unwrap();
        let pinned = timed.alloc_pinned(4096).unwrap();
        timed.free_pinned(pinned, 4096).unwrap();
        let t = timed.times();
        let calls = [
            t.reserve.calls,
            t.create_chunk.calls,
            t.map.calls,
            t.set_access.calls,
            t.unmap.calls,
            t.release_chunk.calls,
            t.unreserve.calls,
            t.alloc_pinned.calls,
            t.free_pinned.calls,
        ];
        assert_eq!(calls, [1, 2, 2, 1, 1, 2, 1, 1, 1], "{t:?}");
        assert!(t.map.ms > 0.0 && t.create_chunk.ms > 0.0, "{t:?}");
        drop(timed);
        assert!(sim.live().is_empty(), "{:?}", sim.live());
    }

    #[test]
    fn a_failed_call_is_timed_too() {
        let (timed, _sim) = timed_sim(2);
        // Nothing is reserved at address 0: the map fails, and still took its time.
        let chunk = timed.create_chunk().unwrap();
        assert!(timed.map(0, chunk).is_err());
        assert_eq!(timed.times().map.calls, 1);
        timed.release_chunk(chunk).unwrap();
    }

    #[test]
    fn the_time_of_a_call_is_added_up() {
        let (timed, _sim) = timed_sim(1);
        for _ in 0..3 {
            timed.timed(Call::Unmap, || std::thread::sleep(std::time::Duration::from_millis(5)));
        }
        let unmap = timed.times().unmap;
        assert_eq!(unmap.calls, 3);
        assert!((15.0..1000.0).contains(&unmap.ms), "{unmap:?}");
        assert_eq!(timed.times().map, CallTime::default(), "other kinds are untouched");
    }

    #[test]
    fn calls_from_many_threads_are_all_counted() {
        let (timed, _sim) = timed_sim(8);
        let va = timed.reserve(8 * G).unwrap();
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let timed = &timed;
                s.spawn(move || {
                    let chunk = timed.create_chunk().unwrap();
                    for _ in 0..50 {
                        let at = va + t * G as u64;
                        timed.map(at, chunk).unwrap();
                        timed.unmap(at, G).unwrap();
                    }
                    timed.release_chunk(chunk).unwrap();
                });
            }
        });
        timed.unreserve(va, 8 * G).unwrap();
        let t = timed.times();
        assert_eq!((t.map.calls, t.unmap.calls, t.create_chunk.calls), (200, 200, 4), "{t:?}");
        let json = serde_json::to_string(&t).unwrap();
        assert!(json.contains("\"map\":{\"calls\":200,"), "{json}");
    }
}
