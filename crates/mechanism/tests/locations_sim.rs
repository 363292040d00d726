//! Chunk locations on the simulated node (`SimDevice::node`): the scenarios every backend runs
//! (locations_common), and what only the simulated device can show without crashing a GPU:
//! work refused where its GPU has no access, capacities per GPU, a node without peer access,
//! work ordered across GPUs by events, and the adaptors passing the new calls on.

mod locations_common;

use locations_common::{bytes, copies_between_own_chunks, host_chunk_is_addressable, peer_chunk_mapped_here, read};
use locations_common::{differing, Mapped};
use std::sync::Arc;
use tiermem_mechanism::counting::CountingDevice;
use tiermem_mechanism::sim::{SimDevice, Timing, POISON, SIM_GRANULARITY as G};
use tiermem_mechanism::timing::TimedDevice;
use tiermem_mechanism::{ChunkLocation, Device, DeviceError, StreamPriority};

/// A node of `gpus` simulated GPUs of `chunks` chunks each.
fn node(gpus: usize, chunks: usize) -> Vec<SimDevice> {
    SimDevice::node(gpus, chunks * G).expect("simulated node")
}

/// Asserts that the node got everything back.
fn assert_all_returned(dev: &SimDevice) {
    assert!(dev.live().is_empty(), "still held: {:?}", dev.live());
}

#[test]
fn the_scenarios_of_every_backend_pass_on_a_simulated_node() {
    let gpus = node(2, 4);
    copies_between_own_chunks(&gpus[1]);
    host_chunk_is_addressable(&gpus[0]).expect("the simulated device has host chunks");
    peer_chunk_mapped_here(&gpus[0], &gpus[1]);
    peer_chunk_mapped_here(&gpus[1], &gpus[0]);
    assert_all_returned(&gpus[0]);
    let single = SimDevice::new(4 * G).unwrap();
    copies_between_own_chunks(&single);
    host_chunk_is_addressable(&single).unwrap();
    assert_all_returned(&single);
}

#[test]
fn each_gpu_knows_its_place_in_the_node() {
    let gpus = node(3, 1);
    for (i, gpu) in gpus.iter().enumerate() {
        let info = gpu.info();
        assert_eq!((info.ordinal, info.device_count, info.total_bytes), (i, 3, G));
        assert_eq!(info.peers, (0..3).filter(|&j| j != i).collect::<Vec<_>>());
        assert!(!gpu.peer_access(i) && gpu.peer_access((i + 1) % 3) && !gpu.peer_access(3));
    }
    let single = SimDevice::new(G).unwrap();
    assert_eq!((single.info().ordinal, single.info().device_count), (0, 1));
    assert!(single.info().peers.is_empty());
}

#[test]
fn work_is_refused_where_its_gpu_has_no_access() {
    let gpus = node(2, 2);
    let (zero, one) = (&gpus[0], &gpus[1]);
    let m = Mapped::new(zero, &[ChunkLocation::Gpu(1)]);
    let fault = |r: Result<(), DeviceError>, call: &str| match r {
        Err(DeviceError::Fault(what)) => assert!(what.contains(call) && what.contains("GPU 0"), "{what}"),
        other => panic!("{call} without access from GPU 0: {other:?}"),
    };
    fault(zero.write(m.va, &[1]), "cuMemcpyHtoD");
    one.set_access_from(m.va, G, &[1]).unwrap();
    one.write(m.va, &bytes(4, G)).unwrap();
    assert!(read(one, m.va, G) == bytes(4, G), "GPU 1 has access: its write landed");
    fault(zero.read(m.va, &mut [0]), "cuMemcpyDtoH");

    let plain = zero.alloc_plain(G).unwrap();
    let stream = zero.create_stream(StreamPriority::High).unwrap();
    fault(zero.copy_between_devices_async(plain, m.va, G, stream), "cuMemcpyDtoDAsync");
    fault(zero.memset_async(m.va, 0, G, stream), "cuMemsetD8Async");
    fault(zero.fill_pattern_async(m.va, G / 8, 1, 0, stream), "tiermem_fill");
    // GPU 1 has access to the mapping but not to GPU 0's plain allocation.
    let theirs = one.create_stream(StreamPriority::High).unwrap();
    let refused = one.copy_between_devices_async(plain, m.va, G, theirs).unwrap_err();
    assert!(matches!(&refused, DeviceError::Fault(what) if what.contains("GPU 1")), "{refused}");
    // Work runs on its stream's GPU, whichever device enqueues it.
    let on_one = zero.copy_between_devices_async(plain, m.va, G, theirs).unwrap_err();
    assert!(matches!(&on_one, DeviceError::Fault(what) if what.contains("GPU 1")), "{on_one}");

    zero.set_access_from(m.va, G, &[0]).unwrap();
    zero.copy_between_devices_async(plain, m.va, G, stream).unwrap();
    zero.synchronize_stream(stream).unwrap();
    assert!(read(zero, plain, G) == bytes(4, G), "given access, GPU 0 copies what GPU 1 wrote");
    one.write(m.va, &[9]).unwrap();
    assert_eq!(read(zero, m.va, 1), [9], "access from GPU 0 kept GPU 1's");

    for (dev, s) in [(zero, stream), (one, theirs)] {
        dev.destroy_stream(s).unwrap();
    }
    zero.free_plain(plain).unwrap();
    m.release();
    assert_all_returned(zero);
}

#[test]
fn a_copy_that_runs_after_access_was_lost_is_a_sticky_fault() {
    let gpus = node(2, 2);
    let dev = &gpus[0];
    dev.set_timing(Timing::Lazy);
    let m = Mapped::new(dev, &[ChunkLocation::Gpu(1), ChunkLocation::Gpu(0)]);
    dev.set_access_from(m.va, 2 * G, &[0]).unwrap();
    let stream = dev.create_stream(StreamPriority::High).unwrap();
    dev.copy_between_devices_async(m.at(1), m.at(0), G, stream).unwrap();
    let chunks = m.unmap();
    let err = dev.synchronize_stream(stream).unwrap_err();
    assert!(matches!(&err, DeviceError::Fault(what) if what.contains("between devices")), "{err}");
    assert!(gpus[1].synchronize_stream(tiermem_mechanism::StreamHandle(0)).is_err(), "the node's fault is sticky");
    chunks.into_iter().for_each(|c| dev.release_chunk(c).unwrap());
}

#[test]
fn capacities_are_per_gpu_and_host_chunks_count_on_none() {
    let gpus = node(2, 2);
    let free = |gpu: usize| gpus[gpu].mem_info().unwrap();
    let mine = [gpus[0].create_chunk_at(ChunkLocation::Gpu(1)).unwrap(), gpus[1].create_chunk().unwrap()];
    assert_eq!((free(0), free(1)), ((2 * G, 2 * G), (0, 2 * G)), "chunks count on the GPU they are made on");
    match gpus[0].create_chunk_at(ChunkLocation::Gpu(1)) {
        Err(DeviceError::OutOfMemory { call: "cuMemCreate", detail }) => assert!(detail.contains("GPU 1"), "{detail}"),
        other => panic!("a third chunk on GPU 1 of two: {other:?}"),
    }
    let host: Vec<_> = (0..5).map(|_| gpus[1].create_chunk_at(ChunkLocation::Host).unwrap()).collect();
    let own = [gpus[0].create_chunk().unwrap(), gpus[0].create_chunk().unwrap()];
    assert_eq!((free(0).0, free(1).0), (0, 0), "host chunks take no HBM");
    assert_eq!(gpus[1].live().chunks, 9, "the node counts every chunk");
    match gpus[0].create_chunk_at(ChunkLocation::Gpu(2)) {
        Err(DeviceError::Driver { call: "cuMemCreate", code, .. }) => assert_eq!(code, "CUDA_ERROR_INVALID_DEVICE"),
        other => panic!("a chunk on a GPU the node lacks: {other:?}"),
    }

    // A fresh chunk holds poison wherever it lives.
    let m = Mapped::of(&gpus[0], vec![host[0]]);
    gpus[0].set_access(m.va, G).unwrap();
    assert!(read(&gpus[0], m.va, G).iter().all(|&b| b == POISON));
    m.unmap();

    for chunk in mine.into_iter().chain(own).chain(host) {
        gpus[1].release_chunk(chunk).unwrap();
    }
    assert_eq!((free(0).0, free(1).0), (2 * G, 2 * G), "released chunks give their GPU's memory back");
    assert_all_returned(&gpus[0]);
}

#[test]
fn without_peer_access_a_gpu_reaches_only_its_own_and_host_chunks() {
    let gpus = SimDevice::node_without_peer_access(2, 2 * G).unwrap();
    let (zero, one) = (&gpus[0], &gpus[1]);
    assert!(zero.info().peers.is_empty() && !zero.peer_access(1));
    // Own chunk first, then one on GPU 1: the call fails as a whole and grants nothing.
    let m = Mapped::new(zero, &[ChunkLocation::Gpu(0), ChunkLocation::Gpu(1)]);
    match zero.set_access_from(m.va, 2 * G, &[0]) {
        Err(DeviceError::Driver { call: "cuMemSetAccess", code, detail }) => {
            assert_eq!(code, "CUDA_ERROR_INVALID_DEVICE");
            assert!(detail.contains("GPU 0 has no peer access to GPU 1"), "{detail}");
        }
        other => panic!("access from GPU 0 to a chunk on GPU 1 without peer access: {other:?}"),
    }
    assert!(zero.write(m.va, &[1]).is_err(), "a refused set_access_from granted nothing");
    zero.set_access_from(m.va, G, &[0]).unwrap();
    one.set_access_from(m.at(1), G, &[1]).unwrap();
    assert!(zero.set_access_from(m.va, G, &[1]).is_err(), "nor GPU 1 to a chunk on GPU 0");
    m.release();

    let shared = Mapped::new(zero, &[ChunkLocation::Host]);
    zero.set_access_from(shared.va, G, &[0, 1]).unwrap();
    one.write(shared.va, &bytes(5, G)).unwrap();
    assert!(read(zero, shared.va, G) == bytes(5, G), "a host chunk is open to both GPUs");
    shared.release();
    assert_all_returned(zero);
}

#[test]
fn set_access_from_needs_gpus_that_exist() {
    let gpus = node(2, 1);
    let m = Mapped::new(&gpus[0], &[ChunkLocation::Gpu(0)]);
    for (list, code) in [(&[][..], "CUDA_ERROR_INVALID_VALUE"), (&[0, 2][..], "CUDA_ERROR_INVALID_DEVICE")] {
        match gpus[0].set_access_from(m.va, G, list) {
            Err(DeviceError::Driver { call: "cuMemSetAccess", code: c, .. }) => assert_eq!(c, code, "{list:?}"),
            other => panic!("set_access_from({list:?}): {other:?}"),
        }
    }
    assert!(gpus[0].write(m.va, &[1]).is_err(), "a refused list granted nothing");
    m.release();
}

#[test]
fn events_order_work_across_the_gpus_of_a_node() {
    for timing in Timing::ALL {
        let gpus = node(2, 2);
        let (zero, one) = (&gpus[0], &gpus[1]);
        zero.set_timing(timing);
        // A chunk on GPU 0 both GPUs may touch, and one of GPU 1's own.
        let m = Mapped::new(zero, &[ChunkLocation::Gpu(0), ChunkLocation::Gpu(1)]);
        zero.set_access_from(m.va, G, &[0, 1]).unwrap();
        one.set_access_from(m.at(1), G, &[1]).unwrap();
        let (s0, s1) =
            (zero.create_stream(StreamPriority::High).unwrap(), one.create_stream(StreamPriority::Low).unwrap());
        let filled = zero.create_event(false).unwrap();
        zero.fill_pattern_async(m.va, G / 8, 11, 0, s0).unwrap();
        zero.record_event(filled, s0).unwrap();
        one.stream_wait_event(s1, filled).unwrap();
        one.copy_between_devices_async(m.at(1), m.va, G, s1).unwrap();
        one.synchronize_stream(s1).unwrap();
        assert_eq!(differing(one, m.at(1), G / 8, 11), 0, "{timing:?}: GPU 1's copy waited for GPU 0's kernel");
        zero.destroy_event(filled).unwrap();
        zero.destroy_stream(s0).unwrap();
        one.destroy_stream(s1).unwrap();
        m.release();
        assert_all_returned(zero);
    }
}

#[test]
fn overlapping_ranges_are_refused() {
    let dev = SimDevice::new(2 * G).unwrap();
    let m = Mapped::new(&dev, &[ChunkLocation::Gpu(0), ChunkLocation::Gpu(0)]);
    dev.set_access(m.va, 2 * G).unwrap();
    let stream = dev.create_stream(StreamPriority::High).unwrap();
    let err = dev.copy_between_devices_async(m.va + 8, m.va, G, stream).unwrap_err();
    assert!(matches!(err, DeviceError::Driver { call: "cuMemcpyDtoDAsync", .. }), "{err}");
    dev.destroy_stream(stream).unwrap();
    m.release();
}

#[test]
fn the_adaptors_pass_the_location_calls_on() {
    let gpus = node(2, 2);
    let sim: Arc<dyn Device> = Arc::new(gpus.into_iter().next().unwrap());
    let counting = Arc::new(CountingDevice::new(Arc::clone(&sim)));
    let timed = TimedDevice::new(counting.clone());
    copies_between_own_chunks(&timed);
    host_chunk_is_addressable(&timed).unwrap();
    let t = timed.times();
    // Two chunks each scenario; the first scenario's one set_access_from, the second's one.
    assert_eq!((t.create_chunk.calls, t.set_access.calls, t.release_chunk.calls), (4, 2, 4), "{t:?}");
    let peer = timed.create_chunk_at(ChunkLocation::Gpu(1)).unwrap();
    assert_eq!(counting.held().chunks, 1, "{:?}", counting.held());
    timed.release_chunk(peer).unwrap();
    assert!(counting.held().is_empty(), "{:?}", counting.held());
    assert!(timed.peer_access(1) && !timed.peer_access(0), "peer access as the device says");
}

#[test]
fn an_allocation_of_several_granules_maps_once_and_goes_back_with_its_last_unmap() {
    let gpus = node(2, 8);
    let me = &gpus[0];
    let size = 4 * G;
    let va = me.reserve(size).unwrap();
    let slab = me.create_chunks_at(ChunkLocation::Gpu(1), 4).unwrap();
    assert_eq!(gpus[1].mem_info().unwrap().0, 4 * G, "four granules taken on GPU 1");
    assert!(me.map_sized(va, slab, 2 * G).is_err(), "a part of an allocation is not a mapping");
    me.map_sized(va, slab, size).unwrap();
    me.set_access_from(va, size, &[0]).unwrap();
    me.write(va + (3 * G) as u64, &[9; 16]).unwrap();
    assert!(me.release_chunk(slab).is_err(), "a mapped allocation is not released");
    me.release_mapped_chunk(slab).unwrap();
    assert_eq!(gpus[1].mem_info().unwrap().0, 4 * G, "the mapping keeps the memory");
    let mut b = [0u8; 16];
    me.read(va + (3 * G) as u64, &mut b).unwrap();
    assert_eq!(b, [9; 16]);
    me.unmap(va, size).unwrap();
    assert_eq!(gpus[1].mem_info().unwrap().0, 8 * G, "the last unmap gave it back");
    me.unreserve(va, size).unwrap();
    assert_all_returned(me);
}
