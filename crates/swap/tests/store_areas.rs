//! Areas (areas.rs): allocated on the first write, freed when their last page is discarded,
//! with what the engine holds going down with them; pages never written read as zeros without
//! the engine; partial pages; areas of several chunks; bad requests and settings refused.

mod support;

use support::{assert_device_holds, config, open, pattern, Model, CHUNK, MIB};
use tiermem_swap::{Blocks, Limits, SwapError, VramStore, PAGE};

fn engine_buffers(store: &VramStore) -> usize {
    store.engine().stats().buffers.len()
}

#[test]
fn an_area_lives_from_its_first_write_until_its_last_page_is_discarded() {
    let store = open(config("areas-live", 8 * CHUNK, 4, 1, 8));
    store.write(0, &pattern(1, PAGE as usize)).unwrap();
    store.write(CHUNK + 5 * PAGE, &pattern(2, 2 * PAGE as usize)).unwrap();
    store.write(3 * CHUNK, &pattern(3, PAGE as usize)).unwrap();
    let stats = store.stats();
    assert_eq!((stats.areas_live, stats.bytes_present), (3, 4 * PAGE));
    assert_eq!(engine_buffers(&store), 3);
    assert_eq!(store.engine().stats().hbm.chunks, 3);

    // Discarding one of the two pages of area 1 keeps it; the other frees it.
    store.discard(CHUNK + 5 * PAGE, PAGE).unwrap();
    assert_eq!((store.stats().areas_live, engine_buffers(&store)), (3, 3));
    store.discard(CHUNK + 6 * PAGE, PAGE).unwrap();
    assert_eq!((store.stats().areas_live, engine_buffers(&store)), (2, 2));
    assert_eq!(store.engine().stats().hbm.chunks, 2, "the freed area's chunk holds no data any more");

    let mut page = vec![0xFFu8; PAGE as usize];
    store.read(CHUNK + 5 * PAGE, &mut page).unwrap();
    assert!(page.iter().all(|&b| b == 0), "discarded pages read as zeros");

    // A discard of the whole device frees everything, and the GPU gets its memory back.
    store.discard(0, 8 * CHUNK).unwrap();
    let stats = store.stats();
    assert_eq!((stats.areas_live, stats.bytes_present), (0, 0));
    assert_eq!(engine_buffers(&store), 0);
    let engine = store.engine().stats();
    assert_eq!((engine.hbm.chunks, engine.host.chunks), (0, 0));
    store.engine().release_idle_hbm().unwrap();
    let (free, total) = store.engine().device().mem_info().unwrap();
    assert_eq!(free, total, "no HBM held once every area is gone");
}

#[test]
fn areas_in_the_spill_file_give_their_slots_back_when_discarded() {
    let size = 8 * CHUNK;
    let store = open(config("areas-file", size, 2, 1, 8));
    let bytes = pattern(4, size as usize);
    store.write(0, &bytes).unwrap();
    let before = store.stats();
    assert!(before.file_bytes >= 5 * CHUNK, "8 areas over 2 chunks of HBM and 1 of host: {before}");
    store.discard(0, 6 * CHUNK).unwrap();
    let after = store.stats();
    assert_eq!(after.areas_live, 2);
    assert!(after.hbm_bytes + after.host_bytes + after.file_bytes <= 2 * CHUNK, "{after}");
    let mut expected = bytes;
    expected[..6 * CHUNK as usize].fill(0);
    assert_device_holds(&store, &expected);
}

#[test]
fn pages_never_written_read_as_zeros_without_asking_the_engine() {
    let store = open(config("areas-zeros", 4 * CHUNK, 2, 1, 4));
    let mut out = vec![0xA5u8; (4 * CHUNK) as usize];
    store.read(0, &mut out).unwrap();
    assert!(out.iter().all(|&b| b == 0));
    // Half of an area written: the other half is zero-filled by the store, not read.
    store.write(CHUNK, &pattern(5, (CHUNK / 2) as usize)).unwrap();
    let reads_before = store.engine().stats().transfers.clone();
    store.read(CHUNK + CHUNK / 2, &mut out[..(CHUNK / 2) as usize]).unwrap();
    assert!(out[..(CHUNK / 2) as usize].iter().all(|&b| b == 0));
    assert_eq!(store.engine().stats().transfers, reads_before, "the engine was not asked");
    assert_eq!(engine_buffers(&store), 1);
}

#[test]
fn a_partial_page_discard_zeroes_its_bytes_and_keeps_the_page() {
    let store = open(config("areas-partial-discard", 2 * CHUNK, 2, 1, 4));
    let data = pattern(6, 2 * PAGE as usize);
    store.write(0, &data).unwrap();
    store.discard(512, 1024).unwrap();
    store.discard(PAGE + 3584, 1024).unwrap(); // the end of page 1 and the start of page 2 (never written)
    assert_eq!(store.stats().bytes_present, 2 * PAGE, "pages covered in part stay present");
    let mut expected = data;
    expected[512..1536].fill(0);
    expected[(PAGE + 3584) as usize..].fill(0);
    let mut out = vec![0u8; 3 * PAGE as usize];
    store.read(0, &mut out).unwrap();
    assert!(out[..2 * PAGE as usize] == expected[..] && out[2 * PAGE as usize..].iter().all(|&b| b == 0));
}

#[test]
fn a_sector_written_into_a_discarded_page_reads_zeros_around_it() {
    let store = open(config("areas-partial-write", 2 * CHUNK, 2, 1, 4));
    store.write(0, &pattern(7, 4 * PAGE as usize)).unwrap();
    store.discard(PAGE, PAGE).unwrap();
    let sector = pattern(8, 512);
    store.write(PAGE + 1024, &sector).unwrap();
    let mut page = vec![0xFFu8; PAGE as usize];
    store.read(PAGE, &mut page).unwrap();
    assert!(page[..1024].iter().all(|&b| b == 0), "the old bytes before the sector came back");
    assert_eq!(&page[1024..1536], &sector[..]);
    assert!(page[1536..].iter().all(|&b| b == 0), "the old bytes after the sector came back");
}

/// Areas of two chunks over a device whose last area is a single chunk: requests that cross
/// chunk and area boundaries, against the model.
#[test]
fn areas_of_several_chunks_and_a_short_last_area_keep_every_byte() {
    let size = 5 * CHUNK;
    let mut config = config("areas-large", size, 3, 1, 8);
    config.area_size = Some(2 * CHUNK);
    let store = open(config);
    let mut model = Model::new(size);
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut next = |bound: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % bound
    };
    for round in 0..300u64 {
        let offset = next(size / 512) * 512;
        let len = (1 + next(3 * CHUNK / 512)) * 512;
        let len = len.min(size - offset);
        match next(3) {
            0 | 1 => {
                let data = pattern(round, len as usize);
                store.write(offset, &data).unwrap();
                model.write(offset, &data);
            }
            _ => {
                store.discard(offset, len).unwrap();
                model.discard(offset, len);
            }
        }
        assert_eq!(store.stats().areas_live, model.areas_live(2 * CHUNK), "round {round}");
    }
    assert_eq!(store.stats().bytes_present, model.bytes_present());
    assert_device_holds(&store, &model.bytes);
    store.discard(0, size).unwrap();
    assert_eq!(engine_buffers(&store), 0);
}

#[test]
fn requests_outside_the_device_are_refused_and_change_nothing() {
    let size = 2 * CHUNK;
    let store = open(config("areas-range", size, 2, 1, 4));
    let data = pattern(9, size as usize);
    store.write(0, &data).unwrap();
    let mut out = vec![0u8; 1024];
    let refusals = [
        store.read(size - 512, &mut out),
        store.write(size - 512, &pattern(10, 1024)),
        store.discard(size - 512, 1024),
        store.read(u64::MAX - 100, &mut out),
        store.discard(u64::MAX, 2),
    ];
    for refusal in refusals {
        match refusal {
            Err(e @ SwapError::OutOfRange { size: s, .. }) => {
                assert_eq!(s, size);
                assert_eq!(e.errno(), libc::EINVAL);
                assert!(e.to_string().contains("outside the device"), "{e}");
            }
            other => panic!("a request past the end: {other:?}"),
        }
    }
    assert_eq!(store.stats().requests.errors, 5);
    store.read(size, &mut []).unwrap();
    assert_device_holds(&store, &data);
}

#[test]
fn open_refuses_settings_that_cannot_work_and_says_what_to_change() {
    let refusal = |config| match VramStore::open(config) {
        Err(e @ SwapError::Config { .. }) => {
            assert_eq!(e.errno(), libc::EINVAL);
            e.to_string()
        }
        Err(other) => panic!("expected a configuration error, got {other}"),
        Ok(_) => panic!("opened a store that cannot work"),
    };
    // 4 chunks of GPU, 1 of host, 4 of file: 9 chunks at most.
    let e = refusal(config("open-too-large", 10 * CHUNK, 4, 1, 4));
    assert!(e.contains("cannot fit") && e.contains("spill file") && e.contains("20.00 MiB"), "{e}");
    VramStore::open(config("open-fits", 9 * CHUNK, 4, 1, 4)).expect("9 chunks fit in 9");
    let e = refusal(config("open-odd", 3 * MIB + 512, 4, 1, 4));
    assert!(e.contains("multiple of 4096"), "{e}");
    let e = refusal(config("open-zero", 0, 4, 1, 4));
    assert!(e.contains("multiple of 4096"), "{e}");
    let mut odd_areas = config("open-areas", 4 * CHUNK, 4, 1, 4);
    odd_areas.area_size = Some(3 * MIB);
    let e = refusal(odd_areas);
    assert!(e.contains("area_size") && e.contains("multiple of the engine's"), "{e}");
    let mut inverted = config("open-limits", 4 * CHUNK, 4, 1, 4);
    inverted.limits = Limits { soft_free: MIB, hard_free: 2 * MIB, ..inverted.limits };
    let e = refusal(inverted);
    assert!(e.contains("must not exceed the soft limit"), "{e}");
}

/// A first write whose engine call fails (here: the spill file fails while making room) fails
/// alone: the area is not registered, the engine keeps no buffer for it, and everything else
/// reads back; once the file works again the same write succeeds.
#[test]
fn a_failed_first_write_leaves_the_area_as_it_was() {
    let size = 8 * CHUNK;
    let store = open(config("areas-failed-write", size, 2, 1, 8));
    let mut expected = vec![0u8; size as usize];
    for area in 0..4u64 {
        let data = pattern(20 + area, CHUNK as usize);
        store.write(area * CHUNK, &data).unwrap();
        expected[(area * CHUNK) as usize..((area + 1) * CHUNK) as usize].copy_from_slice(&data);
    }
    let buffers = engine_buffers(&store);
    store.engine().inject_file_errors(Some(1), 7);
    let fresh = pattern(30, PAGE as usize);
    let mut failures = 0;
    for area in 4..8u64 {
        match store.write(area * CHUNK, &fresh) {
            Err(e @ SwapError::Engine { .. }) => {
                assert_eq!(e.errno(), libc::EIO);
                failures += 1;
            }
            Err(other) => panic!("unexpected error {other}"),
            Ok(()) => expected[(area * CHUNK) as usize..][..PAGE as usize].copy_from_slice(&fresh),
        }
    }
    assert!(failures > 0, "with every file write failing, some first write must fail");
    let stats = store.stats();
    assert_eq!(
        stats.areas_live as usize,
        engine_buffers(&store),
        "an area registered without a buffer, or the reverse"
    );
    assert_eq!(engine_buffers(&store), buffers + 4 - failures);
    assert_eq!(stats.requests.errors, failures as u64);
    store.engine().inject_file_errors(None, 0);
    assert_device_holds(&store, &expected);
    for area in 4..8u64 {
        store.write(area * CHUNK, &fresh).unwrap();
        expected[(area * CHUNK) as usize..][..PAGE as usize].copy_from_slice(&fresh);
    }
    assert_device_holds(&store, &expected);
}

#[test]
fn dropping_the_store_removes_the_spill_file_and_stops_the_monitor() {
    let mut config = config("areas-drop", 8 * CHUNK, 2, 1, 8);
    config.poll = Some(std::time::Duration::from_millis(1));
    let spill = config.engine.file.clone().unwrap();
    let store = open(config);
    store.write(0, &pattern(40, (8 * CHUNK) as usize)).unwrap();
    assert!(spill.exists() && store.stats().file_bytes > 0);
    drop(store);
    assert!(!spill.exists(), "the spill file outlived the store");
}

#[test]
fn the_status_text_says_where_the_bytes_are() {
    let store = open(config("areas-status", 8 * CHUNK, 2, 1, 8));
    store.write(0, &pattern(41, (3 * CHUNK) as usize)).unwrap();
    store.discard(0, CHUNK).unwrap();
    let stats = store.stats();
    assert_eq!((stats.requests.writes, stats.requests.discards, stats.requests.bytes_written), (1, 1, 3 * CHUNK));
    let text = stats.to_string();
    for part in
        ["device 16.00 MiB: 4.00 MiB present in 2 of 8 areas of 2.00 MiB", "budget 4.00 MiB", "1 writes (6.00 MiB)"]
    {
        assert!(text.contains(part), "{part:?} missing from:\n{text}");
    }
}
