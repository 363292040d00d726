//! Round trips through the file store on both I/O paths, slot allocation, and bad input.

mod file_store_common;

use file_store_common::{config, open, read_one, write_one, AlignedBuf, PATHS};
use std::os::unix::fs::MetadataExt;
use tiermem_mechanism::file_store::{FileSlot, FileStore, FileStoreError, IoChoice, IoPath};

const SLOT: usize = 64 << 10;

fn round_trip(io: IoChoice) {
    let n = 96;
    let Some(store) = open(config("roundtrip", n, SLOT, io)) else {
        return;
    };
    assert_eq!(store.io_path(), if io == IoChoice::Uring { IoPath::Uring } else { IoPath::Threads });
    assert_eq!(store.capacity_slots(), n);
    let slots = store.alloc(n).unwrap();
    assert_eq!(store.used_slots(), n);
    // One contiguous source region cut into slots, written in three calls of odd sizes.
    let src = AlignedBuf::random(n * SLOT, 7);
    for range in [0..5, 5..70, 70..n] {
        let items: Vec<_> = range.map(|i| (slots[i], src.ptr().wrapping_add(i * SLOT))).collect();
        // SAFETY: each pointer is 4096-aligned with SLOT bytes of `src` behind it.
        unsafe { store.write(&items) }.unwrap();
    }
    // Read back in a scrambled order, all in one call, into a different region.
    let mut dst = AlignedBuf::new(n * SLOT);
    let order: Vec<usize> = (0..n).map(|i| (i * 37) % n).collect();
    let base = dst.mut_ptr();
    let items: Vec<_> = order.iter().enumerate().map(|(k, &i)| (slots[i], base.wrapping_add(k * SLOT))).collect();
    // SAFETY: distinct aligned SLOT-sized pieces of `dst`, which lives through the call.
    unsafe { store.read(&items) }.unwrap();
    for (k, &i) in order.iter().enumerate() {
        assert!(
            dst.as_slice()[k * SLOT..(k + 1) * SLOT] == src.as_slice()[i * SLOT..(i + 1) * SLOT],
            "slot {i} came back different"
        );
    }
    // Overwrite a few slots; the others keep their data.
    let new = AlignedBuf::random(SLOT, 99);
    write_one(&store, slots[10], &new).unwrap();
    let mut one = AlignedBuf::new(SLOT);
    read_one(&store, slots[10], &mut one).unwrap();
    assert!(one.as_slice() == new.as_slice());
    read_one(&store, slots[11], &mut one).unwrap();
    assert!(one.as_slice() == &src.as_slice()[11 * SLOT..12 * SLOT]);
    // Reading a slot again (a read-only buffer paged in twice) gives the same bytes.
    read_one(&store, slots[11], &mut one).unwrap();
    assert!(one.as_slice() == &src.as_slice()[11 * SLOT..12 * SLOT]);
}

#[test]
fn round_trip_uring() {
    round_trip(IoChoice::Uring);
}

#[test]
fn round_trip_threads() {
    round_trip(IoChoice::Threads);
}

/// Several threads use one store at once, each with its own slots.
#[test]
fn concurrent_callers() {
    for io in PATHS {
        let Some(store) = open(config("concurrent", 64, SLOT, io)) else {
            continue;
        };
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let store = &store;
                s.spawn(move || {
                    let slots = store.alloc(16).unwrap();
                    for round in 0..5u64 {
                        let bufs: Vec<_> =
                            (0..16).map(|i| AlignedBuf::random(SLOT, t * 1000 + round * 100 + i)).collect();
                        let items: Vec<_> = slots.iter().zip(&bufs).map(|(&s, b)| (s, b.ptr())).collect();
                        // SAFETY: aligned SLOT-sized buffers that outlive the call.
                        unsafe { store.write(&items) }.unwrap();
                        let mut back: Vec<_> = (0..16).map(|_| AlignedBuf::new(SLOT)).collect();
                        let items: Vec<_> = slots.iter().zip(&mut back).map(|(&s, b)| (s, b.mut_ptr())).collect();
                        // SAFETY: as above, distinct and writable.
                        unsafe { store.read(&items) }.unwrap();
                        for (a, b) in bufs.iter().zip(&back) {
                            assert!(a.as_slice() == b.as_slice());
                        }
                    }
                    store.free(&slots).unwrap();
                });
            }
        });
        assert_eq!(store.used_slots(), 0);
    }
}

#[test]
fn auto_picks_a_path_and_says_which() {
    let store = FileStore::open(config("auto", 4, SLOT, IoChoice::Auto)).unwrap();
    eprintln!("IoChoice::Auto chose: {}", store.io_path());
    let (mem, off) = store.alignment();
    assert!(mem.is_power_of_two() && off.is_power_of_two() && off <= 4096);
    let s = store.alloc(1).unwrap();
    let buf = AlignedBuf::random(SLOT, 1);
    write_one(&store, s[0], &buf).unwrap();
}

#[test]
fn contiguous_allocation_and_reuse_after_free() {
    let path_cfg = config("alloc", 16, SLOT, IoChoice::Threads);
    let path = path_cfg.path.clone();
    let store = FileStore::open(path_cfg).unwrap();
    let a = store.alloc(4).unwrap();
    let b = store.alloc(4).unwrap();
    assert_eq!(a, (0..4).map(FileSlot).collect::<Vec<_>>());
    assert_eq!(b, (4..8).map(FileSlot).collect::<Vec<_>>());
    // Write them so that freeing has disk space to give back.
    let src = AlignedBuf::random(SLOT, 3);
    for &s in a.iter().chain(&b) {
        write_one(&store, s, &src).unwrap();
    }
    let blocks_written = std::fs::metadata(&path).unwrap().blocks();
    store.free(&a).unwrap();
    let blocks_freed = std::fs::metadata(&path).unwrap().blocks();
    assert!(
        blocks_freed + (4 * SLOT / 512) as u64 <= blocks_written,
        "free punched no holes: {blocks_written} -> {blocks_freed} blocks"
    );
    assert_eq!(store.used_slots(), 4);
    // The freed run is reused first, and a run that fits is preferred over splitting.
    assert_eq!(store.alloc(2).unwrap(), vec![FileSlot(0), FileSlot(1)]);
    assert_eq!(store.alloc(8).unwrap(), (8..16).map(FileSlot).collect::<Vec<_>>());
    // Only slots 2 and 3 are free now.
    assert_eq!(store.alloc(3), None, "alloc beyond what is free must take nothing");
    assert_eq!(store.used_slots(), 14);
    assert_eq!(store.alloc(2).unwrap(), vec![FileSlot(2), FileSlot(3)]);
    assert_eq!(store.alloc(1), None);
    assert_eq!(store.used_slots(), 16);
    assert_eq!(store.alloc(0), Some(vec![]));
    // A freed slot that is allocated again holds no data until written.
    store.free(&[FileSlot(5)]).unwrap();
    let again = store.alloc(1).unwrap();
    assert_eq!(again, vec![FileSlot(5)]);
    let mut dst = AlignedBuf::new(SLOT);
    let err = read_one(&store, FileSlot(5), &mut dst).unwrap_err();
    assert!(matches!(err, FileStoreError::NoData { slot: 5, .. }), "{err}");
    // Fragmented: free 1, 3 and 9..12; a request for 4 gets the run 9..12 whole.
    store.free(&[FileSlot(1), FileSlot(3)]).unwrap();
    store.free(&(9..12).map(FileSlot).collect::<Vec<_>>()).unwrap();
    store.free(&[FileSlot(12)]).unwrap();
    assert_eq!(store.alloc(4).unwrap(), (9..13).map(FileSlot).collect::<Vec<_>>());
    // No run of 2: pieces.
    assert_eq!(store.alloc(2).unwrap(), vec![FileSlot(1), FileSlot(3)]);
}

#[test]
fn full_store_and_bad_slots() {
    let store = FileStore::open(config("full", 4, SLOT, IoChoice::Threads)).unwrap();
    let all = store.alloc(4).unwrap();
    assert_eq!(store.alloc(1), None);
    let full = FileStoreError::Full { used: store.used_slots(), capacity: store.capacity_slots() };
    assert_eq!(full.to_string(), "file store full: 4 slots of 4 in use");
    // Double free and out-of-range slots change nothing.
    store.free(&all[..1]).unwrap();
    let err = store.free(&all[..2]).unwrap_err();
    assert!(err.to_string().contains("slot 0 is not allocated (double free?)"), "{err}");
    assert_eq!(store.used_slots(), 3, "a failed free must free nothing");
    let err = store.free(&[FileSlot(1), FileSlot(1)]).unwrap_err();
    assert!(err.to_string().contains("listed twice"), "{err}");
    let err = store.free(&[FileSlot(4)]).unwrap_err();
    assert!(err.to_string().contains("out of range"), "{err}");
    assert_eq!(store.used_slots(), 3);
    // Writing or reading slots that are not allocated.
    let buf = AlignedBuf::random(SLOT, 5);
    let err = write_one(&store, FileSlot(0), &buf).unwrap_err();
    assert_eq!(err.to_string(), "FileStore::write: slot 0 is not allocated");
    let err = write_one(&store, FileSlot(99), &buf).unwrap_err();
    assert!(matches!(err, FileStoreError::BadSlot { slot: 99, .. }), "{err}");
    // The same slot twice in one write.
    // SAFETY: aligned, SLOT bytes, alive through the call.
    let err = unsafe { store.write(&[(FileSlot(1), buf.ptr()), (FileSlot(1), buf.ptr())]) }.unwrap_err();
    assert!(err.to_string().contains("appears twice"), "{err}");
    // Never written.
    let mut dst = AlignedBuf::new(SLOT);
    let err = read_one(&store, FileSlot(2), &mut dst).unwrap_err();
    assert_eq!(
        err.to_string(),
        "FileStore::read: slot 2 holds no data (never written, freed, or its last write failed)"
    );
    // Empty calls are fine.
    // SAFETY: nothing to touch.
    unsafe {
        store.write(&[]).unwrap();
        store.read(&[]).unwrap();
    }
    store.free(&[]).unwrap();
}

#[test]
fn misaligned_buffer_is_an_error() {
    for io in PATHS {
        let Some(store) = open(config("badbuf", 2, SLOT, io)) else {
            continue;
        };
        let s = store.alloc(1).unwrap();
        let buf = AlignedBuf::random(2 * SLOT, 5);
        let odd = buf.ptr().wrapping_add(1);
        // SAFETY: SLOT readable bytes behind `odd`; the store must refuse it before any I/O.
        let err = unsafe { store.write(&[(s[0], odd)]) }.unwrap_err();
        assert!(matches!(err, FileStoreError::BadBuffer { slot: 0, .. }), "{err}");
        assert!(err.to_string().contains("not aligned"), "{err}");
        // SAFETY: as above.
        let err = unsafe { store.write(&[(s[0], std::ptr::null())]) }.unwrap_err();
        assert!(matches!(err, FileStoreError::BadBuffer { .. }), "{err}");
    }
}

#[test]
fn misaligned_config_is_a_clear_error() {
    let mut cfg = config("badcfg", 4, SLOT, IoChoice::Threads);
    let path = cfg.path.clone();
    cfg.slot_size = 1000;
    cfg.capacity = 4000;
    let err = FileStore::open(cfg.clone()).unwrap_err();
    assert!(matches!(err, FileStoreError::Config(_)), "{err}");
    assert!(err.to_string().contains("not a multiple of the direct-I/O offset alignment"), "{err}");
    assert!(!path.exists(), "a failed open must not leave its file behind");

    cfg.slot_size = SLOT;
    cfg.capacity = SLOT * 3 + 4096;
    let err = FileStore::open(cfg.clone()).unwrap_err();
    assert!(err.to_string().contains("multiple of slot_size"), "{err}");

    cfg.capacity = SLOT * 4;
    cfg.queue_depth = 0;
    let err = FileStore::open(cfg.clone()).unwrap_err();
    assert!(err.to_string().contains("queue_depth 0"), "{err}");

    cfg.queue_depth = 4;
    cfg.slot_size = 0;
    assert!(FileStore::open(cfg.clone()).is_err());

    cfg.slot_size = SLOT;
    cfg.path = "/nonexistent-dir/x.slots".into();
    let err = FileStore::open(cfg).unwrap_err();
    assert!(err.to_string().starts_with("open failed on /nonexistent-dir/x.slots: "), "{err}");

    assert!("bogus".parse::<IoChoice>().is_err());
    assert_eq!("io_uring".parse::<IoChoice>().unwrap(), IoChoice::Uring);
}

#[test]
fn file_is_preallocated_and_removed_on_drop() {
    let cfg = config("lifetime", 8, SLOT, IoChoice::Auto);
    let path = cfg.path.clone();
    let store = FileStore::open(cfg).unwrap();
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), (8 * SLOT) as u64);
    assert!(meta.blocks() * 512 >= (8 * SLOT) as u64, "not preallocated: {meta:?}");
    drop(store);
    assert!(!path.exists());
}

/// `recycle` frees slots without punching holes: the disk blocks stay allocated, a recycled
/// slot can be allocated and written again, and its old data is never read back as new.
#[test]
fn recycled_slots_keep_their_blocks_and_are_reused() {
    for io in PATHS {
        let cfg = config("recycle", 8, SLOT, io);
        let path = cfg.path.clone();
        let Some(store) = open(cfg) else {
            continue;
        };
        let slots = store.alloc(8).unwrap();
        for (i, &slot) in slots.iter().enumerate() {
            write_one(&store, slot, &AlignedBuf::random(SLOT, i as u64)).unwrap();
        }
        let blocks_before = std::fs::metadata(&path).unwrap().blocks();
        store.recycle(&slots[..4]).unwrap();
        assert_eq!(store.used_slots(), 4);
        assert_eq!(std::fs::metadata(&path).unwrap().blocks(), blocks_before, "recycle must not punch holes");
        let again = store.alloc(4).expect("recycled slots are free again");
        let mut back = AlignedBuf::new(SLOT);
        assert!(read_one(&store, again[0], &mut back).is_err(), "a recycled slot holds no data until written");
        let fresh = AlignedBuf::random(SLOT, 99);
        write_one(&store, again[0], &fresh).unwrap();
        read_one(&store, again[0], &mut back).unwrap();
        assert!(back.as_slice() == fresh.as_slice());
        assert!(store.recycle(&[FileSlot(1000)]).is_err(), "an out-of-range slot is refused");
    }
}
