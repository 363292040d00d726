use super::driver::{self, format_cuda_version};
use super::*;
use crate::{ChunkLocation, Device, PhysHandle, StreamPriority};
use std::os::fd::AsFd;

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn cuda_device_is_send_and_sync() {
    assert_send_sync::<CudaDevice>();
}

#[test]
fn cuda_version_formats_like_the_driver() {
    assert_eq!(format_cuda_version(13000), "13.0");
    assert_eq!(format_cuda_version(12080), "12.8");
    assert_eq!(format_cuda_version(12040), "12.4");
}

#[test]
fn panic_messages_are_recovered() {
    let p = std::panic::catch_unwind(|| panic!("Missing symbol cuFoo")).unwrap_err();
    assert_eq!(driver::panic_message(p.as_ref()), "Missing symbol cuFoo");
}

#[test]
fn open_without_driver_is_no_driver() {
    // SAFETY: only probes whether the library can be loaded.
    if unsafe { sys::is_culib_present() } {
        eprintln!("libcuda is present: the no-driver path cannot be tested here");
        return;
    }
    match CudaDevice::open(0) {
        Err(DeviceError::NoDriver(msg)) => {
            assert!(msg.contains("libcuda.so"), "{msg}");
            assert!(msg.contains("TIERMEM_BACKEND=sim"), "{msg}");
        }
        Err(other) => panic!("expected NoDriver, got {other}"),
        Ok(dev) => panic!("opened a CUDA device without libcuda: {:?}", dev.info()),
    }
}

/// Skips (returns `None`) where there is no driver or no GPU.
fn gpu() -> Option<CudaDevice> {
    match CudaDevice::open(0) {
        Ok(dev) => Some(dev),
        Err(DeviceError::NoDriver(why) | DeviceError::NoDevice(why)) => {
            eprintln!("skipped: {why}");
            None
        }
        Err(other) => panic!("CudaDevice::open(0): {other}"),
    }
}

#[test]
fn gpu_open_reports_the_device() {
    let Some(dev) = gpu() else { return };
    let info = dev.info();
    eprintln!("{info:?}");
    assert_eq!(info.backend, BackendKind::Cuda);
    assert!(info.vmm_supported);
    assert!(info.granularity.is_power_of_two(), "{info:?}");
    assert!(info.total_bytes > 0);
    assert!(!info.peers.contains(&0));
    eprintln!("host-located chunks: {:?}", dev.host_prop.as_ref().map(|prop| prop.location));
    assert_eq!(dev.devices.len(), info.device_count);
    let (free, total) = dev.mem_info().unwrap();
    assert!(free <= total && total > 0);
    assert!(CudaDevice::open(info.device_count).is_err_and(|e| matches!(e, DeviceError::NoDevice(_))));
}

#[test]
fn gpu_chunks_move_behind_a_stable_address() {
    let Some(dev) = gpu() else { return };
    let g = dev.info().granularity;
    let n = 4;
    let va = dev.reserve(n * g).unwrap();
    let chunks: Vec<_> = (0..n).map(|_| dev.create_chunk().unwrap()).collect();
    for (i, c) in chunks.iter().enumerate() {
        dev.map(va + (i * g) as u64, *c).unwrap();
    }
    dev.set_access(va, n * g).unwrap();

    let pattern: Vec<u8> = (0..n * g).map(|i| (i % 251) as u8).collect();
    dev.write(va, &pattern).unwrap();
    let mut back = vec![0u8; n * g];
    dev.read(va, &mut back).unwrap();
    assert!(back == pattern);

    // Page chunk 1 out through pinned memory on a high-priority stream, then unmap the whole
    // range in one call (the probe), map the chunks back in another order and page chunk 1 in.
    let hi = dev.create_stream(StreamPriority::High).unwrap();
    let lo = dev.create_stream(StreamPriority::Low).unwrap();
    let (t0, t1) = (dev.create_event(true).unwrap(), dev.create_event(true).unwrap());
    let done = dev.create_event(false).unwrap();
    let host = dev.alloc_pinned(g).unwrap();
    dev.record_event(t0, hi).unwrap();
    // SAFETY: `host` is pinned, g bytes, and untouched until `hi` is synchronized.
    unsafe { dev.copy_to_host_async(host, va + g as u64, g, hi) }.unwrap();
    dev.record_event(t1, hi).unwrap();
    dev.record_event(done, hi).unwrap();
    dev.stream_wait_event(lo, done).unwrap();
    dev.synchronize_event(done).unwrap();
    assert!(dev.event_done(done).unwrap());
    let ms = dev.elapsed_ms(t0, t1).unwrap();
    eprintln!("2 MiB D2H: {ms} ms");
    assert!(ms >= 0.0);

    dev.unmap(va, n * g).unwrap();
    dev.map(va, chunks[0]).unwrap();
    dev.map(va + g as u64, chunks[2]).unwrap();
    dev.map(va + (2 * g) as u64, chunks[1]).unwrap();
    dev.map(va + (3 * g) as u64, chunks[3]).unwrap();
    dev.set_access(va, n * g).unwrap();
    // Chunk 2 now sits at granule 1: overwrite it with the saved bytes of old granule 1.
    // SAFETY: `host` holds g bytes and is not touched until `lo` is synchronized.
    unsafe { dev.copy_to_device_async(va + g as u64, host, g, lo) }.unwrap();
    dev.memset_async(va + (3 * g) as u64, 0xAB, g, lo).unwrap();
    dev.synchronize_stream(lo).unwrap();
    dev.read(va, &mut back).unwrap();
    assert!(back[..2 * g] == pattern[..2 * g]);
    assert!(back[2 * g..3 * g] == pattern[g..2 * g]);
    assert!(back[3 * g..].iter().all(|&b| b == 0xAB));

    dev.unmap(va, n * g).unwrap();
    // Mapping a second chunk over a mapped granule must fail, naming cuMemMap.
    dev.map(va, chunks[0]).unwrap();
    let err = dev.map(va, chunks[1]).unwrap_err();
    assert!(matches!(err, DeviceError::Driver { call: "cuMemMap", .. }), "{err}");
    dev.unmap(va, g).unwrap();
    for c in chunks {
        dev.release_chunk(c).unwrap();
    }
    dev.unreserve(va, n * g).unwrap();
    dev.free_pinned(host, g).unwrap();
    for e in [t0, t1, done] {
        dev.destroy_event(e).unwrap();
    }
    dev.destroy_stream(hi).unwrap();
    dev.destroy_stream(lo).unwrap();
    assert!(dev.destroy_stream(StreamHandle(0)).is_err());

    let plain = dev.alloc_plain(g).unwrap();
    dev.write(plain, &pattern[..g]).unwrap();
    dev.free_plain(plain).unwrap();
}

#[test]
fn gpu_out_of_memory_is_reported_as_such() {
    let Some(dev) = gpu() else { return };
    let too_big = dev.info().total_bytes * 4;
    let err = dev.alloc_plain(too_big).unwrap_err();
    assert!(matches!(err, DeviceError::OutOfMemory { call: "cuMemAlloc_v2", .. }), "{err}");
}

#[test]
fn gpu_threads_without_a_context_get_ours_and_keep_it() {
    let Some(dev) = gpu() else { return };
    let dev = std::sync::Arc::new(dev);
    let g = dev.info().granularity;
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let dev = dev.clone();
            std::thread::spawn(move || {
                let va = dev.reserve(2 * g).unwrap();
                let (a, b) = (dev.create_chunk().unwrap(), dev.create_chunk().unwrap());
                dev.map(va, a).unwrap();
                dev.map(va + g as u64, b).unwrap();
                dev.set_access(va, 2 * g).unwrap();
                dev.write(va + g as u64 - 2, &[1, 2, 3, 4]).unwrap();
                let mut four = [0u8; 4];
                dev.read(va + g as u64 - 2, &mut four).unwrap();
                assert_eq!(four, [1, 2, 3, 4]);
                let mut cur: sys::CUcontext = std::ptr::null_mut();
                // SAFETY: valid out-pointer.
                let r = unsafe { sys::cuCtxGetCurrent(&mut cur) };
                assert_eq!(r, CUresult::CUDA_SUCCESS);
                assert_eq!(cur, dev.ctx, "a thread without a context keeps ours");
                dev.unmap(va, 2 * g).unwrap();
                dev.release_chunk(a).unwrap();
                dev.release_chunk(b).unwrap();
                dev.unreserve(va, 2 * g).unwrap();
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
}

/// Prints what the driver does with edge cases the engine and the simulated device must agree
/// on, and what the VMM calls cost; asserts nothing about them.
#[test]
fn gpu_driver_semantics_probe() {
    let Some(dev) = gpu() else { return };
    let g = dev.info().granularity;
    let show = |what: &str, r: Result<()>| eprintln!("PROBE {what}: {r:?}");
    let va = dev.reserve(4 * g).unwrap();
    let c: Vec<_> = (0..4).map(|_| dev.create_chunk().unwrap()).collect();
    show("unmap never-mapped granule", dev.unmap(va, g));
    dev.map(va, c[0]).unwrap();
    show("set_access over mapped+unmapped", dev.set_access(va, 2 * g));
    show("unmap 2 granules, only first mapped", dev.unmap(va, 2 * g));
    show("map c0 again after that", dev.map(va, c[0]));
    show("map c1 at granule 1", dev.map(va + g as u64, c[1]));
    show("unmap second half of a 2-mapping range", dev.unmap(va + g as u64, g));
    show("map one chunk at two addresses", dev.map(va + 2 * g as u64, c[0]));
    show("set_access 3 granules", dev.set_access(va, 3 * g));
    let mut b = [0u8; 1];
    show("read through 2nd mapping of c0", dev.read(va + 2 * g as u64, &mut b));
    show("unmap 3 granules", dev.unmap(va, 3 * g));
    show("map c0 for release test", dev.map(va, c[0]));
    show("release a mapped chunk", dev.release_chunk(c[0]));
    show("set_access after release", dev.set_access(va, g));
    show("write after release", dev.write(va, &[7]));
    show("read after release", dev.read(va, &mut b));
    show("unreserve with a mapping left", dev.unreserve(va, 4 * g));
    show("unmap after release", dev.unmap(va, g));
    show("unreserve half", dev.unreserve(va, 2 * g));
    show("unreserve", dev.unreserve(va, 4 * g));
    for h in &c[1..] {
        dev.release_chunk(*h).unwrap();
    }
    show("release twice", dev.release_chunk(c[1]));
    show("alloc_pinned(0)", dev.alloc_pinned(0).map(|_| ()));
    show("reserve(0)", dev.reserve(0).map(|_| ()));
    show("reserve(g/2)", dev.reserve(g / 2).map(|_| ()));
    show("unmap on freed reservation", dev.unmap(va, g));

    // Holes: granules 0 and 2 mapped, 1 not.
    let va = dev.reserve(3 * g).unwrap();
    let (a, b2) = (dev.create_chunk().unwrap(), dev.create_chunk().unwrap());
    dev.map(va, a).unwrap();
    dev.map(va + 2 * g as u64, b2).unwrap();
    show("hole: set_access 0..3", dev.set_access(va, 3 * g));
    show("hole: read granule 0", dev.read(va, &mut b));
    show("hole: read granule 2", dev.read(va + 2 * g as u64, &mut b));
    show("hole: set_access granule 2", dev.set_access(va + 2 * g as u64, g));
    show("hole: read granule 2 again", dev.read(va + 2 * g as u64, &mut b));
    show("hole: unmap 0..3", dev.unmap(va, 3 * g));
    // One chunk at two addresses, access set on each separately.
    dev.map(va, a).unwrap();
    dev.map(va + g as u64, a).unwrap();
    show("alias: set_access both", dev.set_access(va, 2 * g));
    show("alias: write via first", dev.write(va, &[42]));
    let r = dev.read(va + g as u64, &mut b);
    eprintln!("PROBE alias: read via second: {r:?} value {}", b[0]);
    show("alias: unmap", dev.unmap(va, 2 * g));
    dev.release_chunk(a).unwrap();
    dev.release_chunk(b2).unwrap();
    dev.unreserve(va, 3 * g).unwrap();

    // Costs: 1 GiB of chunks, one call vs per granule.
    let n = 512;
    let va = dev.reserve(n * g).unwrap();
    let t = std::time::Instant::now();
    let c: Vec<_> = (0..n).map(|_| dev.create_chunk().unwrap()).collect();
    let create = t.elapsed();
    let t = std::time::Instant::now();
    for (i, h) in c.iter().enumerate() {
        dev.map(va + (i * g) as u64, *h).unwrap();
    }
    let map = t.elapsed();
    let t = std::time::Instant::now();
    dev.set_access(va, n * g).unwrap();
    let access = t.elapsed();
    let t = std::time::Instant::now();
    dev.set_access(va, n * g).unwrap();
    let access_again = t.elapsed();
    let t = std::time::Instant::now();
    for i in 0..n {
        dev.set_access(va + (i * g) as u64, g).unwrap();
    }
    let access_each = t.elapsed();
    let t = std::time::Instant::now();
    dev.unmap(va, n * g).unwrap();
    let unmap_one = t.elapsed();
    for (i, h) in c.iter().enumerate() {
        dev.map(va + (i * g) as u64, *h).unwrap();
    }
    dev.set_access(va, n * g).unwrap();
    let t = std::time::Instant::now();
    for i in 0..n {
        dev.unmap(va + (i * g) as u64, g).unwrap();
    }
    let unmap_each = t.elapsed();
    let t = std::time::Instant::now();
    for h in c {
        dev.release_chunk(h).unwrap();
    }
    let release = t.elapsed();
    dev.unreserve(va, n * g).unwrap();
    eprintln!(
        "PROBE costs for {n} chunks: create {create:?}, map {map:?}, set_access (1 call) \
         {access:?}, again {access_again:?}, per chunk {access_each:?}, unmap (1 call) {unmap_one:?}, unmap (per chunk) {unmap_each:?}, \
         release {release:?}"
    );
}

/// Copies and memsets over a range of several separately created chunks must reach every
/// chunk. (The engine coalesces adjacent chunks into one transfer.)
#[test]
fn gpu_transfers_span_several_chunk_mappings() {
    let Some(dev) = gpu() else { return };
    let g = dev.info().granularity;
    let n = 3;
    let va = dev.reserve(n * g).unwrap();
    let chunks: Vec<PhysHandle> = (0..n).map(|_| dev.create_chunk().unwrap()).collect();
    for (i, &c) in chunks.iter().enumerate() {
        dev.map(va + (i * g) as u64, c).unwrap();
    }
    dev.set_access(va, n * g).unwrap();
    let stream = dev.create_stream(StreamPriority::High).unwrap();
    let pattern: Vec<u8> = (0..n * g).map(|i| (i * 7 + i / g) as u8 | 1).collect();
    let host = dev.alloc_pinned(n * g).unwrap();
    // SAFETY: `host` is pinned memory of n*g bytes, unused elsewhere until freed below.
    unsafe { std::ptr::copy_nonoverlapping(pattern.as_ptr(), host as *mut u8, n * g) };
    // SAFETY: as above; the stream is synchronised before the memory is touched again.
    unsafe { dev.copy_to_device_async(va, host, n * g, stream).unwrap() };
    dev.synchronize_stream(stream).unwrap();
    let mut back = vec![0u8; n * g];
    dev.read(va, &mut back).unwrap();
    assert!(back == pattern, "one copy over {n} chunk mappings did not reach them all");
    dev.memset_async(va, 0, n * g, stream).unwrap();
    dev.synchronize_stream(stream).unwrap();
    dev.read(va, &mut back).unwrap();
    let nonzero_chunks: Vec<usize> = (0..n).filter(|&i| back[i * g..(i + 1) * g].iter().any(|&b| b != 0)).collect();
    assert!(nonzero_chunks.is_empty(), "one memset over {n} chunk mappings left chunks {nonzero_chunks:?} unset");
    dev.unmap(va, n * g).unwrap();
    chunks.into_iter().for_each(|c| dev.release_chunk(c).unwrap());
    dev.unreserve(va, n * g).unwrap();
    dev.free_pinned(host, n * g).unwrap();
    dev.destroy_stream(stream).unwrap();
}

#[test]
fn gpu_pinned_memory_of_any_size_carries_bytes_both_ways_and_frees() {
    let Some(dev) = gpu() else { return };
    let stream = dev.create_stream(StreamPriority::High).unwrap();
    // Less than a huge page, several, and not a multiple of one.
    for size in [4096, 64 << 20, (6 << 20) + 12288] {
        let host = dev.alloc_pinned(size).unwrap();
        let back = dev.alloc_pinned(size).unwrap();
        let device = dev.alloc_plain(size).unwrap();
        // SAFETY: `host` holds `size` writable bytes until freed below.
        let bytes = unsafe { std::slice::from_raw_parts_mut(host as *mut u8, size) };
        bytes.iter_mut().enumerate().for_each(|(i, b)| *b = (i * 7 + size) as u8);
        // SAFETY: all three live and `size` long until the stream is synchronized and they are freed.
        unsafe {
            dev.copy_to_device_async(device, host, size, stream).unwrap();
            dev.copy_to_host_async(back, device, size, stream).unwrap();
        }
        dev.synchronize_stream(stream).unwrap();
        // SAFETY: as above, for `back`.
        let got = unsafe { std::slice::from_raw_parts(back as *const u8, size) };
        assert!(got == &bytes[..], "{size} bytes through pinned memory came back different");
        dev.free_plain(device).unwrap();
        dev.free_pinned(host, size).unwrap();
        dev.free_pinned(back, size).unwrap();
    }
    assert!(dev.free_pinned(0x1000, 4096).is_err(), "a pointer never given out is refused");
    dev.destroy_stream(stream).unwrap();
}

/// A shareable allocation exported and imported again (in this process, as another process
/// would): both handles map the same memory, so bytes written through either mapping are read
/// through the other.
#[test]
fn gpu_shareable_allocation_is_the_same_memory_once_imported() {
    let Some(dev) = gpu() else { return };
    let g = dev.info().granularity;
    let size = 2 * g;
    let here = ChunkLocation::Gpu(dev.info().ordinal);
    let original = dev.create_shareable_chunks_at(here, 2).unwrap();
    let (first, second) = (dev.reserve(size).unwrap(), dev.reserve(size).unwrap());
    dev.map_sized(first, original, size).unwrap();
    dev.set_access(first, size).unwrap();
    let pattern: Vec<u8> = (0..size).map(|i| (i * 13 + i / g) as u8).collect();
    dev.write(first, &pattern).unwrap();

    let fd = dev.export_chunk(original).unwrap();
    let imported = dev.import_chunk(fd.as_fd(), size).unwrap();
    drop(fd); // the handle keeps the allocation; the descriptor only named it
    dev.map_sized(second, imported, size).unwrap();
    dev.set_access(second, size).unwrap();
    let mut back = vec![0u8; size];
    dev.read(second, &mut back).unwrap();
    assert!(back == pattern, "the imported mapping reads other bytes than were written");

    let other: Vec<u8> = pattern.iter().map(|b| !b).collect();
    dev.write(second, &other).unwrap();
    dev.read(first, &mut back).unwrap();
    assert!(back == other, "a write through the import did not reach the original mapping");

    let plain = dev.create_chunk().unwrap();
    let err = dev.export_chunk(plain).unwrap_err();
    assert!(matches!(err, DeviceError::Driver { call: "cuMemExportToShareableHandle", .. }), "{err}");
    dev.release_chunk(plain).unwrap();

    for (va, handle) in [(first, original), (second, imported)] {
        dev.unmap(va, size).unwrap();
        dev.release_chunk(handle).unwrap();
        dev.unreserve(va, size).unwrap();
    }
}
