//! Shareable allocations on the simulated device (`create_shareable_chunks_at`, `export_chunk`,
//! `import_chunk`): an allocation imported by a second, separately opened simulated node (as
//! another process would import it) is the same memory, and outlives its maker's handle;
//! descriptors that are not such an allocation, or of another size, are refused; shareable
//! allocations count against their GPU's capacity; access follows the allocation's home; the
//! adaptors pass the calls on. tests/sharing_process.rs passes one to a real second process.

mod locations_common;

use locations_common::{bytes, read};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use tiermem_mechanism::counting::CountingDevice;
use tiermem_mechanism::sim::{SimDevice, POISON, SIM_GRANULARITY as G};
use tiermem_mechanism::timing::TimedDevice;
use tiermem_mechanism::{ChunkLocation, Device, DeviceError, DevicePtr, PhysHandle};

/// A node of `gpus` simulated GPUs of `chunks` chunks each.
fn node(gpus: usize, chunks: usize) -> Vec<SimDevice> {
    SimDevice::node(gpus, chunks * G).expect("simulated node")
}

fn assert_all_returned(dev: &SimDevice) {
    assert!(dev.live().is_empty(), "still held: {:?}", dev.live());
}

/// Maps all `size` bytes of `chunk` in a new reservation of `dev`, with access from `gpus`.
fn map_new(dev: &dyn Device, chunk: PhysHandle, size: usize, gpus: &[usize]) -> DevicePtr {
    let va = dev.reserve(size).unwrap();
    dev.map_sized(va, chunk, size).unwrap();
    dev.set_access_from(va, size, gpus).unwrap();
    va
}

/// Unmaps, releases and unreserves what `map_new` made.
fn unmap_release(dev: &dyn Device, va: DevicePtr, chunk: PhysHandle, size: usize) {
    dev.unmap(va, size).unwrap();
    dev.release_chunk(chunk).unwrap();
    dev.unreserve(va, size).unwrap();
}

/// Asserts that `r` is a driver error of `call` whose detail contains `says`.
fn assert_refused<T: std::fmt::Debug>(r: Result<T, DeviceError>, call: &str, says: &str) {
    match r {
        Err(DeviceError::Driver { call: c, detail, .. }) if c == call => assert!(detail.contains(says), "{detail}"),
        other => panic!("expected {call} to fail saying {says:?}, got {other:?}"),
    }
}

#[test]
fn an_import_in_another_node_is_the_same_memory_and_outlives_the_original() {
    let maker = node(2, 8);
    let importer = node(2, 8); // opened on its own: stands in for another process
    let (one, there) = (&maker[1], &importer[0]);
    let size = 4 * G;
    let original = one.create_shareable_chunks_at(ChunkLocation::Gpu(1), 4).unwrap();
    assert_eq!(one.mem_info().unwrap().0, 4 * G, "four granules taken on GPU 1");
    let va = map_new(one, original, size, &[1]);
    assert!(read(one, va, size).iter().all(|&b| b == POISON), "a fresh allocation holds poison");
    let mut expected = bytes(1, size);
    one.write(va, &expected).unwrap();

    let fd = one.export_chunk(original).unwrap();
    let imported = there.import_chunk(fd.as_fd(), size).unwrap();
    drop(fd); // the handles keep the allocation; the descriptor only named it
    assert_eq!(there.mem_info().unwrap().0, 8 * G, "an import takes none of the importer's HBM");
    let va_there = map_new(there, imported, size, &[0]);
    assert!(read(there, va_there, size) == expected, "the import reads what the maker wrote");

    let note = b"written through the import";
    let at = 3 * G - 7; // across the last two granules
    there.write(va_there + at as u64, note).unwrap();
    assert_eq!(read(one, va + at as u64, note.len()), note, "the maker reads what the import wrote");
    expected[at..at + note.len()].copy_from_slice(note);

    unmap_release(one, va, original, size);
    assert_eq!(one.mem_info().unwrap().0, 8 * G, "the maker's GPU got its capacity back");
    assert_all_returned(one);
    assert!(read(there, va_there, size) == expected, "the import still holds the bytes");
    unmap_release(there, va_there, imported, size);
    assert_all_returned(there);
}

#[test]
fn a_handle_given_up_while_mapped_keeps_its_memory_until_the_last_unmap() {
    let gpus = node(1, 4);
    let dev = &gpus[0];
    let size = 2 * G;
    let chunk = dev.create_shareable_chunks_at(ChunkLocation::Gpu(0), 2).unwrap();
    let (first, second) = (map_new(dev, chunk, size, &[0]), map_new(dev, chunk, size, &[0]));
    dev.write(first + 1, &[42]).unwrap();
    assert_eq!(read(dev, second + 1, 1), [42], "two mappings of one allocation");
    assert_refused(dev.release_chunk(chunk), "cuMemRelease", "still mapped");
    dev.release_mapped_chunk(chunk).unwrap();
    assert_refused(dev.export_chunk(chunk), "cuMemExportToShareableHandle", "given up");
    let spare = dev.reserve(size).unwrap();
    assert_refused(dev.map_sized(spare, chunk, size), "cuMemMap", "dead chunk");
    dev.unmap(first, size).unwrap();
    assert_eq!(dev.mem_info().unwrap().0, 2 * G, "one mapping left keeps the memory");
    assert_eq!(read(dev, second + 1, 1), [42]);
    dev.unmap(second, size).unwrap();
    assert_eq!(dev.mem_info().unwrap().0, 4 * G, "the last unmap freed it");
    assert_refused(dev.release_chunk(chunk), "cuMemRelease", "not live");
    for va in [first, second, spare] {
        dev.unreserve(va, size).unwrap();
    }
    assert_all_returned(dev);
}

#[test]
fn what_is_not_an_allocation_of_that_size_is_refused_and_changes_nothing() {
    let gpus = node(1, 8);
    let dev = &gpus[0];
    let shared = dev.create_shareable_chunks_at(ChunkLocation::Host, 4).unwrap();
    let fd = dev.export_chunk(shared).unwrap();
    let before = dev.live();

    let (read_end, write_end) = pipe();
    let plain_path = std::env::temp_dir().join(format!("tiermem-sharing-{}", std::process::id()));
    let plain = std::fs::File::create(&plain_path).unwrap();
    plain.set_len(G as u64).unwrap();
    std::fs::remove_file(&plain_path).unwrap();
    let import = "cuMemImportFromShareableHandle";
    for impostor in [read_end.as_fd(), write_end.as_fd(), plain.as_fd()] {
        assert_refused(dev.import_chunk(impostor, G), import, "not a simulated shareable allocation");
    }
    assert_refused(dev.import_chunk(fd.as_fd(), 2 * G), import, &format!("of {} bytes, not {}", 4 * G, 2 * G));
    assert_refused(dev.import_chunk(fd.as_fd(), 0), import, "not whole granules");
    assert_refused(dev.import_chunk(fd.as_fd(), 4 * G + 1), import, "not whole granules");
    assert_eq!(dev.live(), before, "a refused import holds nothing");

    let export = "cuMemExportToShareableHandle";
    let chunk = dev.create_chunk().unwrap();
    let group = dev.create_chunks_at(ChunkLocation::Gpu(0), 2).unwrap();
    for not_shareable in [chunk, group] {
        assert_refused(dev.export_chunk(not_shareable), export, "no live shareable allocation");
    }
    [chunk, group].into_iter().for_each(|c| dev.release_chunk(c).unwrap());

    // The caller's descriptor was left open: it still imports, at the right size.
    let imported = dev.import_chunk(fd.as_fd(), 4 * G).unwrap();
    drop(fd);
    assert_refused(dev.map_sized(0, imported, G), "cuMemMap", "an allocation of 4 granule(s)");
    for handle in [imported, shared] {
        dev.release_chunk(handle).unwrap();
        assert_refused(dev.release_chunk(handle), "cuMemRelease", "not live");
        assert_refused(dev.export_chunk(handle), export, "no live shareable allocation");
    }
    assert_all_returned(dev);
}

/// Both ends of a new pipe.
fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: valid out-array of two descriptors.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0, "pipe2");
    // SAFETY: both were just made by pipe2 and are owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

#[test]
fn shareable_allocations_count_against_their_gpus_capacity() {
    let gpus = node(2, 4);
    let free = |gpu: usize| gpus[gpu].mem_info().unwrap().0;
    let big = gpus[0].create_shareable_chunks_at(ChunkLocation::Gpu(1), 3).unwrap();
    assert_eq!((free(0), free(1)), (4 * G, G), "counted on the GPU it was made on");
    match gpus[0].create_shareable_chunks_at(ChunkLocation::Gpu(1), 2) {
        Err(DeviceError::OutOfMemory { call: "cuMemCreate", detail }) => assert!(detail.contains("GPU 1"), "{detail}"),
        other => panic!("two granules more on GPU 1 with one free: {other:?}"),
    }
    let last = gpus[1].create_chunk().unwrap();
    assert!(matches!(gpus[1].create_chunk(), Err(DeviceError::OutOfMemory { .. })), "chunks see it too");
    assert_refused(gpus[0].create_shareable_chunks_at(ChunkLocation::Gpu(2), 1), "cuMemCreate", "2 GPU(s)");
    assert_refused(gpus[0].create_shareable_chunks_at(ChunkLocation::Gpu(0), 0), "cuMemCreate", "0 granules");
    let host = gpus[0].create_shareable_chunks_at(ChunkLocation::Host, 6).unwrap();
    assert_eq!((free(0), free(1)), (4 * G, 0), "host memory takes no HBM");
    assert_eq!(gpus[0].live().chunks, 10, "the node counts every granule");

    gpus[1].release_chunk(big).unwrap();
    assert_eq!(free(1), 3 * G, "released, it gives its GPU's capacity back");
    let fits = gpus[1].create_shareable_chunks_at(ChunkLocation::Gpu(1), 3).unwrap();
    for handle in [fits, last, host] {
        gpus[0].release_chunk(handle).unwrap();
    }
    assert_eq!((free(0), free(1)), (4 * G, 4 * G));
    assert_all_returned(&gpus[0]);
}

#[test]
fn access_follows_where_the_allocation_is_and_imports_open_to_every_gpu() {
    let gpus = SimDevice::node_without_peer_access(2, 2 * G).unwrap();
    let (zero, one) = (&gpus[0], &gpus[1]);
    let theirs = one.create_shareable_chunks_at(ChunkLocation::Gpu(1), 1).unwrap();
    let va = zero.reserve(G).unwrap();
    zero.map(va, theirs).unwrap();
    assert_refused(zero.set_access_from(va, G, &[0]), "cuMemSetAccess", "GPU 0 has no peer access to GPU 1");
    one.set_access_from(va, G, &[1]).unwrap();
    one.write(va, b"from GPU 1").unwrap();

    // Imported, the allocation's home is not known: every GPU of the importing node may reach it.
    let other = SimDevice::node_without_peer_access(2, 2 * G).unwrap();
    let fd = one.export_chunk(theirs).unwrap();
    let imported = other[0].import_chunk(fd.as_fd(), G).unwrap();
    let va_there = map_new(&other[0], imported, G, &[0, 1]);
    assert_eq!(read(&other[1], va_there, 10), b"from GPU 1");
    unmap_release(&other[0], va_there, imported, G);
    assert_all_returned(&other[0]);

    unmap_release(zero, va, theirs, G);
    assert_all_returned(zero);
}

#[test]
fn the_adaptors_pass_the_sharing_calls_on() {
    let gpus = node(2, 4);
    let sim: Arc<dyn Device> = Arc::new(gpus.into_iter().next().unwrap());
    let counting = Arc::new(CountingDevice::new(Arc::clone(&sim)));
    let timed = TimedDevice::new(counting.clone());
    let made = timed.create_shareable_chunks_at(ChunkLocation::Gpu(1), 2).unwrap();
    let fd = timed.export_chunk(made).unwrap();
    let imported = timed.import_chunk(fd.as_fd(), 2 * G).unwrap();
    assert_eq!(counting.held().chunks, 2, "{:?}", counting.held());
    assert_eq!(timed.times().create_chunk.calls, 2, "creating and importing make handles");
    let va = map_new(&timed, imported, 2 * G, &[0]);
    assert!(read(&timed, va, 2 * G).iter().all(|&b| b == POISON), "the import maps the allocation made");
    unmap_release(&timed, va, imported, 2 * G);
    timed.release_chunk(made).unwrap();
    assert!(counting.held().is_empty(), "{:?}", counting.held());
}
