//! Spilling the host tier to the file without the engine's lock: a call that runs through
//! `Engine::unlocked_waits` (acquire, write, read, page_in, advance, page_out) and finds the
//! host tier full starts the file write in the background, waits for it with the lock
//! released, and commits it when it runs again. Made certain by pausing the write inside the
//! file store (failpoint `file_store::write`): while it is paused, another thread's acquires of
//! resident memory complete — they could not if the spill held the lock — and the write is
//! not committed yet. A failed spill loses nothing and fails the call that needed the room.
//!
//! Run with `cargo test -p tiermem --features failpoints`.
#![cfg(feature = "failpoints")]

mod support;

use std::sync::{mpsc, Arc};
use std::time::Duration;
use support::failpoints::{pause_first, scenario};
use support::{assert_contents, buffer_stats, fill, sim_engine, CHUNK};
use tiermem::{Access, AllocOptions, BufferId, Engine, EngineConfig, Error, Region, StreamHandle, Target, Tier};

/// HBM of 4 chunks, a host tier of 2, a file tier of 32 on a temporary file.
fn small_host(name: &str) -> (Arc<Engine>, Arc<tiermem::mechanism::sim::SimDevice>) {
    let path = support::file_tier_path(name);
    let config = EngineConfig { batch_chunks: 2, file: Some(path), file_limit: 32 * CHUNK, ..support::config() };
    let (engine, sim) = sim_engine(8, 4, 2, config);
    (Arc::new(engine), sim)
}

/// A buffer of one chunk, filled, that stays in HBM: the test holds it acquired until it
/// releases the returned region.
fn held_resident(engine: &Engine) -> (BufferId, Vec<u8>, [Region; 1]) {
    let (resident, _) = engine.alloc(CHUNK, AllocOptions::default()).unwrap();
    let bytes = fill(engine, resident, CHUNK, 1);
    let held = [Region::whole(resident)];
    engine.acquire(&held, Access::ReadOnly, StreamHandle(0)).unwrap();
    (resident, bytes, held)
}

/// Runs `spill` on a thread of its own, pausing the first file write it starts. While the write
/// is paused: the write runs on a file writer's thread, not the caller's; another thread
/// acquires `resident` (held resident) a hundred times and reads it back, byte for byte; no
/// file write is committed. Then lets the write go and returns what `spill` returned.
fn while_a_spill_is_paused<T: Send + 'static>(
    engine: &Arc<Engine>,
    (resident, resident_bytes): (BufferId, &[u8]),
    spill: impl FnOnce(&Engine) -> T + Send + 'static,
) -> T {
    let (at_write, go) = pause_first("file_store::write");
    let spilling = {
        let engine = Arc::clone(engine);
        std::thread::spawn(move || spill(&engine))
    };
    let writer = at_write.recv_timeout(Duration::from_secs(10)).expect("the call spills to the file");
    assert_eq!(writer.as_deref(), Some("tiermem-file-write"), "the spill writes on a thread of its own");

    let (done, finished) = mpsc::channel();
    let cheap = {
        let engine = Arc::clone(engine);
        std::thread::spawn(move || {
            let region = [Region::whole(resident)];
            let mut outcome = Ok(());
            for _ in 0..100 {
                outcome = outcome
                    .and_then(|()| engine.acquire(&region, Access::ReadOnly, StreamHandle(0)))
                    .and_then(|()| engine.release(&region, StreamHandle(0)));
            }
            let mut back = vec![0u8; CHUNK];
            let _ = done.send(outcome.and_then(|()| engine.read(resident, 0, &mut back)).map(|()| back));
        })
    };
    let outcome = finished.recv_timeout(Duration::from_secs(10));
    let file_writes = outcome.is_ok().then(|| engine.stats().transfers.file_writes);
    go.wait();
    let back = outcome.expect("an acquire of resident memory waited for another thread's spill").unwrap();
    assert!(back == resident_bytes, "the resident buffer read back changed");
    assert_eq!(file_writes, Some(0), "the spill was committed before its write was let go");
    cheap.join().unwrap();
    let returned = spilling.join().unwrap();
    fail::remove("file_store::write");
    assert!(engine.stats().transfers.file_writes > 0, "the spill was committed");
    returned
}

/// Another thread's acquires (host writes) force spills to the file.
#[test]
fn acquires_of_resident_memory_go_on_while_another_threads_acquire_spills_to_the_file() {
    let (_guard, scenario) = scenario();
    let (engine, sim) = small_host("spill-unlocked");
    let (resident, resident_bytes, held) = held_resident(&engine);
    let (big, _) = engine.alloc(8 * CHUNK, AllocOptions::default()).unwrap();

    // Writing 8 chunks through 3 free chunks of HBM and 2 host slots must spill to the file:
    // each chunk written is an acquire for writing that evicts a dirty chunk to the host tier.
    let big_bytes =
        while_a_spill_is_paused(&engine, (resident, &resident_bytes), move |engine| fill(engine, big, 8 * CHUNK, 2));

    assert!(buffer_stats(&engine, big).in_file > 0, "{:?}", buffer_stats(&engine, big));
    engine.release(&held, StreamHandle(0)).unwrap();
    assert_contents(&engine, resident, &resident_bytes);
    assert_contents(&engine, big, &big_bytes);
    support::assert_hbm_accounted(&engine);
    support::assert_no_leaks(Arc::into_inner(engine).unwrap(), Some(sim));
    scenario.teardown();
}

/// Another thread's page-out finds the host tier full and spills it to the file.
#[test]
fn acquires_of_resident_memory_go_on_while_another_threads_page_out_spills_to_the_file() {
    let (_guard, scenario) = scenario();
    let (engine, sim) = small_host("spill-unlocked-page-out");
    let (resident, resident_bytes, held) = held_resident(&engine);
    let (a, _) = engine.alloc(2 * CHUNK, AllocOptions::default()).unwrap();
    let a_bytes = fill(&engine, a, 2 * CHUNK, 3);
    engine.page_out(Target::Buffer(a)).unwrap(); // the host tier is full
    let (b, _) = engine.alloc(2 * CHUNK, AllocOptions::default()).unwrap();
    let b_bytes = fill(&engine, b, 2 * CHUNK, 4);

    while_a_spill_is_paused(&engine, (resident, &resident_bytes), move |engine| {
        engine.page_out(Target::Buffer(b)).unwrap()
    });

    let (a_stats, b_stats) = (buffer_stats(&engine, a), buffer_stats(&engine, b));
    assert_eq!((a_stats.in_file, a_stats.in_host), (2, 0), "{a_stats:?}");
    assert_eq!((b_stats.in_hbm, b_stats.in_host), (0, 2), "{b_stats:?}");
    engine.release(&held, StreamHandle(0)).unwrap();
    assert_contents(&engine, resident, &resident_bytes);
    assert_contents(&engine, a, &a_bytes);
    assert_contents(&engine, b, &b_bytes);
    support::assert_hbm_accounted(&engine);
    support::assert_no_leaks(Arc::into_inner(engine).unwrap(), Some(sim));
    scenario.teardown();
}

/// A spill whose background write fails: the call that needed the room fails with the file
/// tier's error naming it, every chunk keeps its host copy, no file slot stays taken; with the
/// disk back the same call succeeds, and every byte is where it was.
#[test]
fn a_failed_background_spill_loses_nothing() {
    let (_guard, scenario) = scenario();
    let (engine, sim) = small_host("spill-unlocked-fails");
    let (a, _) = engine.alloc(6 * CHUNK, AllocOptions::default()).unwrap();
    let a_bytes = fill(&engine, a, 6 * CHUNK, 3); // 4 chunks in HBM, 2 in the host tier, none in the file
    assert_eq!(buffer_stats(&engine, a).in_host, 2, "{:?}", buffer_stats(&engine, a));
    let (c, _) = engine.alloc(CHUNK, AllocOptions::default()).unwrap();
    let region = [Region::whole(c)];

    fail::cfg("file_store::write", "return").unwrap();
    for call in ["acquire", "write"] {
        let err = match call {
            "acquire" => engine.acquire(&region, Access::ReadWrite, StreamHandle(0)).unwrap_err(),
            _ => engine.write(c, 0, &[7; 4096]).unwrap_err(),
        };
        assert!(matches!(&err, Error::File { call: named, .. } if *named == call), "{err:?}");
        assert!(err.to_string().contains("file tier"), "{err}");
        let stats = buffer_stats(&engine, a);
        assert_eq!((stats.in_hbm, stats.in_host, stats.in_file), (4, 2, 0), "{stats:?}");
        let file = engine.stats().tiers.get(Tier::File).cloned().expect("a file tier");
        assert_eq!(file.used_bytes, 0, "the failed write's file slots are free again");
        assert_eq!(engine.stats().transfers.file_writes, 0);
    }
    fail::remove("file_store::write");

    engine.acquire(&region, Access::ReadWrite, StreamHandle(0)).unwrap();
    engine.release(&region, StreamHandle(0)).unwrap();
    assert!(engine.stats().transfers.file_writes > 0);
    assert_contents(&engine, a, &a_bytes);
    assert_contents(&engine, c, &vec![0; CHUNK]);
    support::assert_hbm_accounted(&engine);
    support::assert_no_leaks(Arc::into_inner(engine).unwrap(), Some(sim));
    scenario.teardown();
}

/// `a` (two chunks) paged out fills the host tier; `b` (two chunks) filled, in HBM beside
/// `resident`. Returns their buffers and bytes.
fn host_tier_full(engine: &Engine) -> ((BufferId, Vec<u8>), (BufferId, Vec<u8>)) {
    let (a, _) = engine.alloc(2 * CHUNK, AllocOptions::default()).unwrap();
    let a_bytes = fill(engine, a, 2 * CHUNK, 3);
    engine.page_out(Target::Buffer(a)).unwrap();
    let (b, _) = engine.alloc(2 * CHUNK, AllocOptions::default()).unwrap();
    let b_bytes = fill(engine, b, 2 * CHUNK, 4);
    ((a, a_bytes), (b, b_bytes))
}

/// Another thread's exchange sends `b` down to a full host tier, which spills `a` to the file.
#[test]
fn acquires_of_resident_memory_go_on_while_another_threads_exchange_spills_to_the_file() {
    let (_guard, scenario) = scenario();
    let (engine, sim) = small_host("spill-unlocked-exchange");
    let (resident, resident_bytes, held) = held_resident(&engine);
    let ((a, a_bytes), (b, b_bytes)) = host_tier_full(&engine);
    let (d, _) = engine.alloc(2 * CHUNK, AllocOptions::default()).unwrap();

    while_a_spill_is_paused(&engine, (resident, &resident_bytes), move |engine| {
        engine.exchange(Target::Buffer(b), Target::Buffer(d)).unwrap()
    });

    let (a_stats, b_stats, d_stats) = (buffer_stats(&engine, a), buffer_stats(&engine, b), buffer_stats(&engine, d));
    assert_eq!(a_stats.in_file, 2, "{a_stats:?}");
    assert_eq!((b_stats.in_hbm, d_stats.in_hbm), (0, 2), "{b_stats:?} {d_stats:?}");
    engine.release(&held, StreamHandle(0)).unwrap();
    for (buffer, bytes) in [(resident, &resident_bytes), (a, &a_bytes), (b, &b_bytes), (d, &vec![0; 2 * CHUNK])] {
        assert_contents(&engine, buffer, bytes);
    }
    support::assert_hbm_accounted(&engine);
    support::assert_no_leaks(Arc::into_inner(engine).unwrap(), Some(sim));
    scenario.teardown();
}

/// A budget shrunk below what is in HBM sends `b` down to a full host tier, which spills `a`.
#[test]
fn acquires_of_resident_memory_go_on_while_a_shrinking_budget_spills_to_the_file() {
    let (_guard, scenario) = scenario();
    let (engine, sim) = small_host("spill-unlocked-budget");
    let (resident, resident_bytes, held) = held_resident(&engine);
    let ((a, a_bytes), (b, b_bytes)) = host_tier_full(&engine);
    while_a_spill_is_paused(&engine, (resident, &resident_bytes), move |engine| {
        let ticket = engine.set_hbm_budget(CHUNK).unwrap();
        engine.finish(ticket).unwrap()
    });
    let (a_stats, b_stats) = (buffer_stats(&engine, a), buffer_stats(&engine, b));
    assert_eq!(a_stats.in_file, 2, "{a_stats:?}");
    assert_eq!((b_stats.in_hbm, b_stats.in_host), (0, 2), "{b_stats:?}");
    engine.release(&held, StreamHandle(0)).unwrap();
    for (buffer, bytes) in [(resident, &resident_bytes), (a, &a_bytes), (b, &b_bytes)] {
        assert_contents(&engine, buffer, bytes);
    }
    support::assert_hbm_accounted(&engine);
    support::assert_no_leaks(Arc::into_inner(engine).unwrap(), Some(sim));
    scenario.teardown();
}

/// Shrunk while `b` is acquired, the budget is met as `b` is released; a release never waits:
/// when sending `b` down must first spill the host tier, the release starts the spill and
/// returns, `b` staying in HBM, and a later call (the budget set again) commits the spill
/// and sends `b` down.
#[test]
fn a_release_beyond_the_budget_starts_a_spill_and_does_not_wait_for_it() {
    let (_guard, scenario) = scenario();
    let (engine, sim) = small_host("spill-unlocked-release");
    let ((a, a_bytes), (b, b_bytes)) = host_tier_full(&engine);
    let b_region = [Region::whole(b)];
    engine.acquire(&b_region, Access::ReadOnly, StreamHandle(0)).unwrap();
    let ticket = engine.set_hbm_budget(CHUNK).unwrap(); // nothing may leave yet
    engine.finish(ticket).unwrap();
    assert_eq!(buffer_stats(&engine, b).in_hbm, 2);

    let (at_write, go) = pause_first("file_store::write");
    engine.release(&b_region, StreamHandle(0)).unwrap(); // returns while the spill is paused
    at_write.recv_timeout(Duration::from_secs(10)).expect("the release spills the host tier");
    assert_eq!(buffer_stats(&engine, b).in_hbm, 2, "b waits for the room the spill makes");
    assert_eq!(engine.stats().transfers.file_writes, 0);
    go.wait();
    fail::remove("file_store::write");

    let ticket = engine.set_hbm_budget(CHUNK).unwrap();
    engine.finish(ticket).unwrap();
    // One chunk of `b` over the budget of one: it takes the host slot of one of `a`'s, spilled.
    let (a_stats, b_stats) = (buffer_stats(&engine, a), buffer_stats(&engine, b));
    assert_eq!((a_stats.in_host, a_stats.in_file), (1, 1), "{a_stats:?}");
    assert_eq!((b_stats.in_hbm, b_stats.in_host), (1, 1), "{b_stats:?}");
    for (buffer, bytes) in [(a, &a_bytes), (b, &b_bytes)] {
        assert_contents(&engine, buffer, bytes);
    }
    support::assert_hbm_accounted(&engine);
    support::assert_no_leaks(Arc::into_inner(engine).unwrap(), Some(sim));
    scenario.teardown();
}
