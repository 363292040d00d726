//! The file tier under failpoints: I/O errors that lose nothing, and background reads and
//! writes made certain by pausing `file_store::write` / `file_store::read` — the call returns
//! while the disk works, other calls go on meanwhile, `finish` and dropping the engine wait,
//! and a page-out that needs a held slot completes the write another thread is finishing.
//!
//! Failpoints are process-global: every test here holds the lock of `support::failpoints`.
//! Run with `cargo test -p tiermem --features failpoints`.
#![cfg(feature = "failpoints")]

mod support;

use std::sync::Arc;
use std::time::Duration;
use support::failpoints::scenario;
use support::{assert_contents, assert_hbm_accounted, buffer_stats, fill, sim_engine, CHUNK};
use tiermem::mechanism::sim::SimDevice;
use tiermem::{Access, AllocOptions, Engine, EngineConfig, Error, Region, StreamHandle, Target};

/// An I/O error while spilling the host tier to the file, or while reading a chunk back from
/// it, fails the call with an error naming the file tier; the chunks stay where they were.
#[test]
fn file_tier_io_errors_lose_nothing() {
    let (_guard, scenario) = scenario();
    let path = support::file_tier_path("failpoints");
    let config = EngineConfig { batch_chunks: 2, file: Some(path), file_limit: 32 * CHUNK, ..support::config() };
    let (engine, sim) = support::sim_engine(4 + 4, 4, 4, config);
    let (a, _) = engine.alloc(6 * CHUNK, AllocOptions::default()).unwrap();
    let bytes = fill(&engine, a, 6 * CHUNK, 3);
    let (b, _) = engine.alloc(6 * CHUNK, AllocOptions::default()).unwrap();

    fail::cfg("file_store::write", "return").unwrap();
    let mut err = None;
    for part in 0..6 {
        if let Err(e) = engine.write(b, part * CHUNK, &[part as u8 + 1; 4096]) {
            err = Some(e);
            break;
        }
    }
    let err = err.expect("writing 12 chunks over 4 of HBM and 4 of host must spill to the file");
    assert!(matches!(err, Error::File { .. }), "{err:?}");
    assert!(err.to_string().contains("file tier"), "{err}");
    fail::remove("file_store::write");
    assert_contents(&engine, a, &bytes);

    engine.page_out_to_file(Target::Buffer(a)).unwrap();
    fail::cfg("file_store::read", "return").unwrap();
    let mut out = vec![0u8; CHUNK];
    let err = engine.read(a, 0, &mut out).unwrap_err();
    assert!(matches!(err, Error::File { call: "read", .. }), "{err:?}");
    fail::remove("file_store::read");
    assert_contents(&engine, a, &bytes);
    drop(engine);
    assert!(sim.live().is_empty(), "{:?}", sim.live());
    scenario.teardown();
}

/// Runs `f` on a thread of its own and returns its result, failing the test if it takes more
/// than ten seconds (a call that waits for a paused write would hang forever).
fn within_seconds<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(f()));
    rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap_or_else(|_| panic!("{what} waited for the disk"))
}

/// Calls `finish` on another thread, then lifts the paused failpoint (a write or a read) it
/// waits for.
fn finish_once_resumed(engine: &Arc<Engine>, ticket: tiermem::Ticket, paused: &str) -> Result<(), Error> {
    let e = Arc::clone(engine);
    let finished = std::thread::spawn(move || e.finish(ticket));
    fail::remove(paused);
    finished.join().expect("finish panicked")
}

fn file_world(name: &str) -> (Arc<Engine>, Arc<SimDevice>) {
    let path = support::file_tier_path(name);
    let config = EngineConfig { batch_chunks: 2, file: Some(path), file_limit: 32 * CHUNK, ..support::config() };
    let (engine, sim) = support::sim_engine(8 + 4, 8, 8, config);
    (Arc::new(engine), sim)
}

/// `page_out_to_file_start` returns while the file write is still going (here: paused), other
/// calls go on meanwhile, and `finish` completes it: the chunks are in the file, and back from
/// it byte for byte.
#[test]
fn a_page_out_to_file_writes_in_the_background() {
    let (_guard, scenario) = scenario();
    let (engine, sim) = file_world("background-write");
    let (a, _) = engine.alloc(4 * CHUNK, AllocOptions::default()).unwrap();
    let a_bytes = fill(&engine, a, 4 * CHUNK, 21);
    let (b, _) = engine.alloc(2 * CHUNK, AllocOptions::default()).unwrap();
    let b_bytes = fill(&engine, b, 2 * CHUNK, 22);

    fail::cfg("file_store::write", "pause").unwrap();
    let e = Arc::clone(&engine);
    let ticket = within_seconds("page_out_to_file_start", move || e.page_out_to_file_start(Target::Buffer(a))).unwrap();
    // The write is paused, yet the engine serves other buffers.
    let e = Arc::clone(&engine);
    within_seconds("an acquire during the write", move || assert_contents(&e, b, &b_bytes));
    assert_eq!(engine.stats().transfers.file_writes, 0, "the write cannot have completed");

    finish_once_resumed(&engine, ticket, "file_store::write").unwrap();
    assert_eq!(buffer_stats(&engine, a).in_file, 4, "{:?}", buffer_stats(&engine, a));
    assert_eq!(engine.stats().transfers.file_writes, 4);
    assert_contents(&engine, a, &a_bytes);
    support::assert_no_leaks(Arc::into_inner(engine).unwrap(), Some(sim));
    scenario.teardown();
}

/// Chunks written to, or freed, while their background write runs: the write's file copies of
/// them are discarded, the new bytes stand, and nothing leaks. A failed write leaves every
/// chunk in the host tier and names `finish` and the file tier; retried, it succeeds.
#[test]
fn a_background_write_never_overrides_what_changed_meanwhile() {
    let (_guard, scenario) = scenario();
    let (engine, sim) = file_world("background-write-races");
    let (a, _) = engine.alloc(2 * CHUNK, AllocOptions::default()).unwrap();
    fill(&engine, a, 2 * CHUNK, 31);
    let (b, _) = engine.alloc(2 * CHUNK, AllocOptions::default()).unwrap();
    fill(&engine, b, 2 * CHUNK, 32);

    fail::cfg("file_store::write", "pause").unwrap();
    let ticket = engine.page_out_to_file_start(Target::All).unwrap();
    let a_new = fill(&engine, a, 2 * CHUNK, 33);
    engine.free(b).unwrap();
    finish_once_resumed(&engine, ticket, "file_store::write").unwrap();
    assert_eq!(engine.stats().transfers.file_writes, 0, "both chunks changed: no file copy may stand");
    assert_contents(&engine, a, &a_new);

    fail::cfg("file_store::write", "return").unwrap();
    let ticket = engine.page_out_to_file_start(Target::Buffer(a)).unwrap();
    let err = engine.finish(ticket).unwrap_err();
    assert!(matches!(err, Error::File { call: "finish", .. }), "{err:?}");
    assert_eq!(buffer_stats(&engine, a).in_host, 2, "a failed write keeps the host copies");
    fail::remove("file_store::write");
    assert_contents(&engine, a, &a_new);
    engine.page_out_to_file(Target::Buffer(a)).unwrap();
    assert_eq!(buffer_stats(&engine, a).in_file, 2);
    assert_contents(&engine, a, &a_new);
    support::assert_no_leaks(Arc::into_inner(engine).unwrap(), Some(sim));
    scenario.teardown();
}

/// An engine dropped with a background write unfinished waits for it before unpinning.
#[test]
fn dropping_the_engine_joins_an_unfinished_write() {
    let (_guard, scenario) = scenario();
    let (engine, sim) = file_world("background-write-drop");
    let (a, _) = engine.alloc(4 * CHUNK, AllocOptions::default()).unwrap();
    fill(&engine, a, 4 * CHUNK, 41);
    let _unfinished = engine.page_out_to_file_start(Target::Buffer(a)).unwrap();
    support::assert_no_leaks(Arc::into_inner(engine).unwrap(), Some(sim));
    scenario.teardown();
}

/// `page_in_start` from the file returns while the disk is still reading (here: paused), other
/// buffers are served meanwhile, and `finish` completes it: back byte for byte, without taking
/// room in the host tier.
#[test]
fn a_page_in_from_the_file_reads_in_the_background() {
    let (_guard, scenario) = scenario();
    let (engine, sim) = file_world("background-read");
    let (a, _) = engine.alloc(4 * CHUNK, AllocOptions::default()).unwrap();
    let a_bytes = fill(&engine, a, 4 * CHUNK, 51);
    let (b, _) = engine.alloc(2 * CHUNK, AllocOptions::default()).unwrap();
    let b_bytes = fill(&engine, b, 2 * CHUNK, 52);
    engine.page_out_to_file(Target::Buffer(a)).unwrap();

    fail::cfg("file_store::read", "pause").unwrap();
    let e = Arc::clone(&engine);
    let ticket = within_seconds("page_in_start", move || e.page_in_start(Target::Buffer(a))).unwrap();
    let e = Arc::clone(&engine);
    within_seconds("an acquire during the read", move || assert_contents(&e, b, &b_bytes));
    assert_eq!(buffer_stats(&engine, a).in_hbm, 4, "mapped at once, its bytes on their way");

    finish_once_resumed(&engine, ticket, "file_store::read").unwrap();
    assert_eq!(engine.stats().transfers.file_reads, 4);
    assert_eq!(buffer_stats(&engine, a).in_host, 0, "a page-in from the file skips the host tier");
    assert_contents(&engine, a, &a_bytes);
    support::assert_no_leaks(Arc::into_inner(engine).unwrap(), Some(sim));
    scenario.teardown();
}

/// A background read that fails is reported by whoever needs its chunks — `finish`, or an
/// `acquire` — with the file tier's error; the chunks go back to the file, whose bytes are
/// intact, and come back whole once the disk works again.
#[test]
fn a_failed_background_read_loses_nothing() {
    let (_guard, scenario) = scenario();
    let (engine, sim) = file_world("background-read-fails");
    let (a, _) = engine.alloc(4 * CHUNK, AllocOptions::default()).unwrap();
    let a_bytes = fill(&engine, a, 4 * CHUNK, 61);
    engine.page_out_to_file(Target::Buffer(a)).unwrap();

    fail::cfg("file_store::read", "return").unwrap();
    let ticket = engine.page_in_start(Target::Buffer(a)).unwrap();
    let err = engine.finish(ticket).unwrap_err();
    assert!(matches!(err, Error::File { call: "finish", .. }), "{err:?}");
    assert_eq!(buffer_stats(&engine, a).in_file, 4, "{:?}", buffer_stats(&engine, a));
    assert_hbm_accounted(&engine);

    let _unfinished = engine.page_in_start(Target::Buffer(a)).unwrap();
    let whole = [Region::whole(a)];
    let err = engine.acquire(&whole, Access::ReadOnly, StreamHandle(0)).unwrap_err();
    assert!(matches!(err, Error::File { call: "acquire", .. }), "{err:?}");
    assert!(err.to_string().contains("file tier"), "{err}");
    assert_eq!(buffer_stats(&engine, a).in_file, 4, "{:?}", buffer_stats(&engine, a));

    fail::remove("file_store::read");
    assert_contents(&engine, a, &a_bytes);
    support::assert_no_leaks(Arc::into_inner(engine).unwrap(), Some(sim));
    scenario.teardown();
}

/// An engine dropped while a read is queued behind a paused one waits for both.
#[test]
fn dropping_the_engine_waits_for_queued_reads() {
    let (_guard, scenario) = scenario();
    let (engine, sim) = file_world("background-read-drop");
    let (a, _) = engine.alloc(4 * CHUNK, AllocOptions::default()).unwrap();
    fill(&engine, a, 4 * CHUNK, 71);
    engine.page_out_to_file(Target::Buffer(a)).unwrap();
    fail::cfg("file_store::read", "pause").unwrap();
    let _unfinished = engine.page_in_start(Target::Buffer(a)).unwrap();
    let dropped = std::thread::spawn(move || support::assert_no_leaks(Arc::into_inner(engine).unwrap(), Some(sim)));
    fail::remove("file_store::read");
    dropped.join().expect("dropping the engine panicked");
    scenario.teardown();
}

/// The file reader's thread panicking (here: in the file store's read) fails the read it had
/// in hand and those queued behind it, so that `finish` and `acquire` report an error instead
/// of waiting forever; reads from the file fail at once afterwards (the reader is gone), and
/// dropping the engine still gives the device everything back. The shuttle model check
/// `a_read_group_dropped_unserved_fails_its_fence` (model_checks.rs) checks the same protocol
/// under many schedules.
#[test]
fn a_panicking_file_reader_fails_its_reads_instead_of_hanging() {
    let (_guard, scenario) = scenario();
    let (engine, sim) = file_world("reader-panic");
    let (a, _) = engine.alloc(4 * CHUNK, AllocOptions::default()).unwrap();
    fill(&engine, a, 4 * CHUNK, 81);
    let (b, _) = engine.alloc(4 * CHUNK, AllocOptions::default()).unwrap();
    fill(&engine, b, 4 * CHUNK, 82);
    engine.page_out_to_file(Target::All).unwrap();

    fail::cfg("file_store::read", "panic(model: the file reader panics)").unwrap();
    let e = Arc::clone(&engine);
    let outcomes = within_seconds("finish after the reader panicked", move || {
        let (ta, tb) = (e.page_in_start(Target::Buffer(a)).unwrap(), e.page_in_start(Target::Buffer(b)).unwrap());
        [e.finish(ta), e.finish(tb)]
    });
    for (outcome, id) in outcomes.into_iter().zip([a, b]) {
        let err = outcome.expect_err("a read the reader never served fails");
        assert!(err.to_string().contains("file reader"), "{err}");
        assert_eq!(buffer_stats(&engine, id).in_file, 4, "chunks that did not arrive go back to the file");
    }
    fail::remove("file_store::read");
    let e = Arc::clone(&engine);
    let err = within_seconds("a read after the reader panicked", move || e.read(a, 0, &mut vec![0u8; CHUNK]))
        .expect_err("the reader is gone");
    assert!(err.to_string().contains("file reader thread has stopped"), "{err}");
    assert_hbm_accounted(&engine);
    support::assert_no_leaks(Arc::into_inner(engine).unwrap(), Some(sim));
    scenario.teardown();
}

/// A page-out that needs the host slot a background write still holds, while the write's own
/// ticket is in `finish` on another thread. `finish` used to take the write out of the engine
/// while it waited for it, so the page-out, finding the host tier full of held slots and no
/// write it could complete, failed with "out of memory". Now it completes the write itself
/// and `finish` reports the outcome.
#[test]
fn a_page_out_completes_a_write_that_another_thread_is_finishing() {
    let (_guard, scenario) = scenario();
    let path = support::file_tier_path("finishing");
    let config = EngineConfig { file: Some(path.clone()), file_limit: 16 * CHUNK, ..support::config() };
    let (engine, sim) = sim_engine(8, 4, 4, config);
    let (a, _) = engine.alloc(CHUNK, AllocOptions::default()).unwrap();
    let a_bytes = fill(&engine, a, CHUNK, 1);
    let (b, _) = engine.alloc(4 * CHUNK, AllocOptions::default()).unwrap();
    let b_bytes = fill(&engine, b, 4 * CHUNK, 2);
    engine.page_out(Target::Buffer(a)).unwrap(); // a's bytes in a host slot, b's in HBM

    fail::cfg("file_store::write", "pause").unwrap();
    let to_file = engine.page_out_to_file_start(Target::Buffer(a)).unwrap(); // holds a's slot
    std::thread::scope(|scope| {
        let finishing = scope.spawn(|| engine.finish(to_file));
        // Let `finish` reach its wait for the paused write (if it has not, the page-out below
        // finds the write with its ticket: the test passes without testing the race).
        std::thread::sleep(Duration::from_millis(100));
        scope.spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            fail::cfg("file_store::write", "off").unwrap();
        });
        // Four slots for b: a's is held by the write, so a is spilled (its slot comes back
        // only once the write is committed).
        engine.page_out(Target::Buffer(b)).expect("the write holding the slot can be completed");
        finishing.join().unwrap().expect("finish reports the write completed by the page-out");
    });

    support::assert_contents(&engine, a, &a_bytes);
    support::assert_contents(&engine, b, &b_bytes);
    engine.free(a).unwrap();
    engine.free(b).unwrap();
    support::assert_no_leaks(engine, Some(sim));
    assert!(!path.exists(), "the file tier's file outlived the engine");
    scenario.teardown();
}
