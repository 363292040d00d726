//! Pinned memory made in pieces (`Device::alloc_pinned_pieces`) on the simulated device, as on a
//! GPU: each piece is a registration of its own, which one copy may not span; the memory is
//! freed whole, and only whole.

mod locations_common;

use locations_common::{bytes, read, Mapped};
use tiermem_mechanism::sim::{SimDevice, SIM_GRANULARITY as G};
use tiermem_mechanism::{ChunkLocation, Device, StreamHandle};

#[test]
fn a_copy_within_a_piece_runs_one_across_two_is_refused_and_the_memory_is_freed_whole() {
    let dev = SimDevice::new(4 * G).unwrap();
    let chunks = Mapped::new(&dev, &[ChunkLocation::Gpu(0), ChunkLocation::Gpu(0)]);
    dev.set_access(chunks.va, chunks.size()).unwrap();
    let host = dev.alloc_pinned_pieces(3 * G, G).unwrap();
    let data = bytes(7, 2 * G);
    // SAFETY: `host` is 3 granules of pinned memory, ours.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), host as *mut u8, 2 * G) };
    let stream = StreamHandle(0);
    // SAFETY: the source stays pinned and unchanged until the stream is synchronized.
    let across = unsafe { dev.copy_to_device_async(chunks.va, host, 2 * G, stream) };
    assert!(across.is_err(), "a copy across two pieces is refused");
    for i in 0..2 {
        // SAFETY: as above.
        unsafe { dev.copy_to_device_async(chunks.at(i), host + i * G, G, stream) }.unwrap();
    }
    dev.synchronize_stream(stream).unwrap();
    assert_eq!(read(&dev, chunks.va, 2 * G), data, "copies piece by piece carry every byte");
    assert!(dev.free_pinned(host, G).is_err(), "a piece alone is not an allocation");
    dev.free_pinned(host, 3 * G).unwrap();
    chunks.release();
    assert!(dev.live().is_empty(), "still held: {:?}", dev.live());
}
