//! A device adaptor whose chunks are several of the driver's granules: each chunk one
//! physical allocation (`cuMemCreate`) and one mapping (`cuMemMap`) of `k` granules.
//!
//! # Why
//! The VMM calls cost per *call*, not per byte: on the H200 making a chunk takes 10–18 µs and
//! mapping it 24–47 µs whatever its size, while copying 2 MiB over PCIe takes 38 µs. Every
//! chunk that comes into HBM afresh pays both (a wake after the HBM went back, a page-in past
//! the chunks the engine keeps made), and every chunk moved pays the engine's bookkeeping and
//! its fences, so with the driver's 2 MiB granule the host, not the link, paces such moves.
//! Chunks of `k` granules pay those costs once per `k` granules. The price is coarseness:
//! buffers round up to whole chunks, and a chunk moves whole.
//!
//! # How
//! The engine asks its device for "a chunk" and maps "a chunk" of `info().granularity` bytes;
//! this adaptor reports the chunk size as the granularity and turns each such call into the
//! inner device's call for `k` granules (`create_chunks_at`, `map_sized`), so the engine, its
//! tiers and its tests need not know. Allocations of `n` chunks become `n × k` granules.
//! Everything else (reservations, copies, unmapping whole mappings) passes through unchanged.

use crate::forward::{forward_host_copies_to_inner, forward_to_inner};
use crate::{
    ChunkLocation, Device, DeviceError, DeviceInfo, DevicePtr, EventHandle, GpuMemory, HostPtr, PhysHandle, Result,
    StreamHandle, StreamPriority,
};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;

/// The largest chunk this adaptor makes: larger ones would round buffers up wastefully and
/// make each move a long, indivisible copy.
pub const MAX_CHUNK: usize = 1 << 30;

pub struct ChunkedDevice {
    inner: Arc<dyn Device>,
    /// `inner`'s description with `granularity` set to the chunk size.
    info: DeviceInfo,
    /// Granules of `inner` per chunk.
    granules: usize,
}

/// The chunk a device of `granularity` makes for a wish of `chunk` bytes: whole granules, at
/// least one.
pub fn chunk_bytes(granularity: usize, chunk: usize) -> usize {
    let granularity = granularity.max(1);
    chunk.div_ceil(granularity).max(1) * granularity
}

impl ChunkedDevice {
    /// `inner` with chunks of `chunk` bytes, rounded up to whole granules of `inner`; `inner`
    /// itself when that is one granule. An error for a chunk above [`MAX_CHUNK`].
    pub fn wrap(inner: Arc<dyn Device>, chunk: usize) -> Result<Arc<dyn Device>> {
        let granularity = inner.info().granularity.max(1);
        if chunk > MAX_CHUNK {
            return Err(DeviceError::Config(format!(
                "TIERMEM_CHUNK (chunk) of {chunk} bytes is more than the {} MiB a chunk may be; choose a smaller one",
                MAX_CHUNK >> 20
            )));
        }
        let granules = chunk_bytes(granularity, chunk) / granularity;
        if granules == 1 {
            return Ok(inner);
        }
        let mut info = inner.info().clone();
        info.granularity = granules * granularity;
        Ok(Arc::new(Self { inner, info, granules }))
    }
}

impl Device for ChunkedDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }
    fn create_chunk_at(&self, location: ChunkLocation) -> Result<PhysHandle> {
        self.inner.create_chunks_at(location, self.granules)
    }
    fn create_chunks_at(&self, location: ChunkLocation, chunks: usize) -> Result<PhysHandle> {
        self.inner.create_chunks_at(location, chunks * self.granules)
    }
    fn create_shareable_chunks_at(&self, location: ChunkLocation, chunks: usize) -> Result<PhysHandle> {
        self.inner.create_shareable_chunks_at(location, chunks * self.granules)
    }
    fn map(&self, va: DevicePtr, chunk: PhysHandle) -> Result<()> {
        self.inner.map_sized(va, chunk, self.info.granularity)
    }
    forward_host_copies_to_inner!();

    forward_to_inner! {
        fn mem_info(&self) -> Result<(usize, usize)>;
        fn gpu_memory(&self, ordinal: usize) -> Result<GpuMemory>;
        fn neighbour(&self, ordinal: usize) -> Result<std::sync::Arc<dyn Device>>;
        fn reserve(&self, size: usize) -> Result<DevicePtr>;
        fn unreserve(&self, va: DevicePtr, size: usize) -> Result<()>;
        fn map_sized(&self, va: DevicePtr, chunk: PhysHandle, size: usize) -> Result<()>;
        fn release_chunk(&self, chunk: PhysHandle) -> Result<()>;
        fn release_mapped_chunk(&self, chunk: PhysHandle) -> Result<()>;
        fn export_chunk(&self, chunk: PhysHandle) -> Result<OwnedFd>;
        fn import_chunk(&self, fd: BorrowedFd<'_>, size: usize) -> Result<PhysHandle>;
        fn set_access_from(&self, va: DevicePtr, size: usize, gpus: &[usize]) -> Result<()>;
        fn unmap(&self, va: DevicePtr, size: usize) -> Result<()>;
        fn alloc_pinned(&self, size: usize) -> Result<HostPtr>;
        fn alloc_pinned_gently(&self, size: usize) -> Result<HostPtr>;
        fn free_pinned(&self, ptr: HostPtr, size: usize) -> Result<()>;
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
        fn free_plain(&self, ptr: DevicePtr) -> Result<()>;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::SimDevice;

    const G: usize = 2 << 20;

    fn sim(granules: usize) -> Arc<SimDevice> {
        Arc::new(SimDevice::new(granules * G).expect("simulated device"))
    }

    #[test]
    fn chunks_round_up_to_whole_granules_and_one_granule_is_the_device_itself() {
        let inner: Arc<dyn Device> = sim(8);
        let same = ChunkedDevice::wrap(Arc::clone(&inner), G).unwrap();
        assert!(Arc::ptr_eq(&same, &inner), "a chunk of one granule needs no adaptor");
        assert_eq!(ChunkedDevice::wrap(Arc::clone(&inner), 1).unwrap().info().granularity, G);
        assert_eq!(ChunkedDevice::wrap(Arc::clone(&inner), 3 * G - 1).unwrap().info().granularity, 3 * G);
        let refused = ChunkedDevice::wrap(inner, MAX_CHUNK + 1).err().expect("too large").to_string();
        assert!(refused.contains("TIERMEM_CHUNK") && refused.contains("1024 MiB"), "{refused}");
    }

    #[test]
    fn a_chunk_is_one_allocation_and_one_mapping_of_its_granules() {
        let sim = sim(16);
        let device = ChunkedDevice::wrap(sim.clone(), 3 * G).unwrap();
        let chunk = device.info().granularity;
        let va = device.reserve(3 * chunk).unwrap();
        // One chunk, then an allocation of two (a peer slab's kind), side by side.
        let one = device.create_chunk().unwrap();
        let two = device.create_chunks_at(ChunkLocation::Gpu(0), 2).unwrap();
        device.map(va, one).unwrap();
        device.map_sized(va + chunk as u64, two, 2 * chunk).unwrap();
        device.set_access(va, 3 * chunk).unwrap();
        let data: Vec<u8> = (0..3 * chunk).map(|i| (i * 7 + i / 4099) as u8).collect();
        device.write(va, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        device.read(va, &mut back).unwrap();
        assert!(back == data, "bytes across chunks and granules read back");
        // A chunk unmaps whole, never a granule of it (as CUDA: whole mappings only).
        assert!(device.unmap(va, G).is_err(), "a granule of a chunk cannot be unmapped alone");
        assert!(device.unmap(va + chunk as u64, chunk).is_err(), "nor half of a two-chunk allocation");
        device.unmap(va, chunk).unwrap();
        device.unmap(va + chunk as u64, 2 * chunk).unwrap();
        device.release_chunk(one).unwrap();
        device.release_chunk(two).unwrap();
        device.unreserve(va, 3 * chunk).unwrap();
        drop(device);
        assert!(sim.live().is_empty(), "{:?}", sim.live());
    }
}
