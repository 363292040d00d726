//! Races between the engine and copies still in flight, each made certain by a simulated
//! device that runs queued work only when waited for, and then only what the wait needs
//! (`Timing::Lazy`). Each test here failed before the fix it names: a regression test for a
//! root cause the property tests found.

mod support;

use support::{pattern, sim_engine, CHUNK};
use tiermem::mechanism::sim::Timing;
use tiermem::Tier;
use tiermem::{Access, AllocOptions, EngineConfig, Region, StreamHandle, Target};

/// A chunk sent down dirty, brought back before that copy landed, and sent down again (clean
/// now: its host slot is, or will be, an identical copy) has two fences in flight: its last
/// use, and the copy into its slot. It used to leave HBM after the first of them, so its
/// physical chunk went to another chunk while the copy down was still to read it, and the
/// host slot got the other chunk's bytes, or none (the property tests saw a pattern where
/// zeros were expected).
#[test]
fn a_chunk_leaves_hbm_only_after_every_copy_in_flight_on_it() {
    let (engine, sim) = sim_engine(8, 4, 8, support::config());
    sim.set_timing(Timing::Lazy);
    let (a, _) = engine.alloc(CHUNK, AllocOptions::default()).unwrap();
    let bytes = pattern(1, CHUNK);
    engine.write(a, 0, &bytes).unwrap(); // its last use: a fence on the legacy stream, not run
    let dirty = engine.page_out_start(Target::Buffer(a)).unwrap(); // copy down behind that use
    engine.prefetch(&[Region::whole(a)]).unwrap(); // cancels the page-out: resident, clean
    let clean = engine.page_out_start(Target::Buffer(a)).unwrap(); // leaves once nothing runs on it
                                                                   // Another chunk's write runs the legacy stream (the last use is done), not the copy down.
    let (b, _) = engine.alloc(CHUNK, AllocOptions::default()).unwrap();
    engine.write(b, 0, &pattern(2, CHUNK)).unwrap();
    engine.page_in(Target::Buffer(b)).unwrap(); // reaps what has landed
    let (c, _) = engine.alloc(CHUNK, AllocOptions::default()).unwrap();
    engine.write(c, 0, &pattern(3, CHUNK)).unwrap(); // takes whatever HBM is idle
    let mut back = vec![0u8; CHUNK];
    engine.read(a, 0, &mut back).unwrap();
    assert!(back == bytes, "the chunk's bytes changed while it was moving down");
    engine.finish(dirty).unwrap();
    engine.finish(clean).unwrap();
    support::assert_no_leaks(engine, Some(sim));
}

/// Making room looks for chunks to evict, and if every candidate is still in use, for the
/// work to wait for. A chunk whose work completed between the two looks used to be neither,
/// and a page-in failed with "out of memory" although it could evict that chunk (seen on the
/// H200 as `HBM 10 of 16 MiB in use (0 acquired)`). Over many schedules of a GPU that
/// completes work at random moments, the acquire always succeeds.
#[test]
fn making_room_never_fails_while_a_chunk_could_be_evicted() {
    for seed in 0..64 {
        let (engine, sim) = sim_engine(8, 4, 8, support::config());
        sim.set_timing(Timing::Eager);
        sim.set_seed(seed);
        let (a, _) = engine.alloc(3 * CHUNK, AllocOptions::default()).unwrap();
        let (b, _) = engine.alloc(2 * CHUNK, AllocOptions::default()).unwrap();
        let a_bytes = support::fill(&engine, a, 3 * CHUNK, 1);
        let b_bytes = support::fill(&engine, b, 2 * CHUNK, 2); // HBM full, one chunk of a on the host
        let one = [Region::bytes(b, 0, 10)];
        engine.acquire(&one, Access::ReadOnly, StreamHandle(0)).unwrap();
        // The chunk of a on the host needs room; the other chunk of b may leave.
        engine
            .acquire(&[Region::whole(a)], Access::ReadOnly, StreamHandle(0))
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        engine.release(&[Region::whole(a)], StreamHandle(0)).unwrap();
        engine.release(&one, StreamHandle(0)).unwrap();
        support::assert_contents(&engine, a, &a_bytes);
        support::assert_contents(&engine, b, &b_bytes);
        support::assert_no_leaks(engine, Some(sim));
    }
}

/// Two page-outs to the file of one chunk, the second started before the first finished, used
/// to hold its host slot twice (a debug assertion; in a release build the first finish could
/// free the slot while the second write still read it). The second now leaves the chunk to
/// the first write. Found by the threads model test.
#[test]
fn a_second_file_write_of_a_chunk_leaves_it_to_the_first() {
    let path = support::file_tier_path("twice");
    let config = EngineConfig { file: Some(path.clone()), file_limit: 8 * CHUNK, ..support::config() };
    let (engine, sim) = sim_engine(8, 4, 4, config);
    sim.set_timing(Timing::Lazy);
    let (a, _) = engine.alloc(CHUNK, AllocOptions::default()).unwrap();
    let bytes = pattern(1, CHUNK);
    engine.write(a, 0, &bytes).unwrap();
    let first = engine.page_out_to_file_start(Target::Buffer(a)).unwrap();
    let second = engine.page_out_to_file_start(Target::Buffer(a)).unwrap();
    engine.finish(second).unwrap();
    engine.finish(first).unwrap();
    support::assert_contents(&engine, a, &bytes);
    let file = engine.stats().tiers.get(Tier::File).cloned().expect("a file tier");
    assert_eq!(file.used_bytes, CHUNK, "one file copy of the chunk, no file slot leaked");
    engine.free(a).unwrap();
    support::assert_no_leaks(engine, Some(sim));
    assert!(!path.exists());
}

/// A page-out that needs host slots while a background write to the file still holds the
/// slot of a chunk spilled meanwhile used to fail with "out of memory" (nothing it knew to wait
/// for): it now completes that write, which gives the slot back.
#[test]
fn a_page_out_waits_for_a_file_write_holding_host_slots() {
    let path = support::file_tier_path("held");
    let config = EngineConfig { file: Some(path.clone()), file_limit: 16 * CHUNK, ..support::config() };
    let (engine, sim) = sim_engine(8, 4, 4, config);
    let (a, _) = engine.alloc(CHUNK, AllocOptions::default()).unwrap();
    let a_bytes = support::fill(&engine, a, CHUNK, 1);
    let to_file = engine.page_out_to_file_start(Target::Buffer(a)).unwrap(); // holds a's host slot
    let (b, _) = engine.alloc(4 * CHUNK, AllocOptions::default()).unwrap();
    let b_bytes = support::fill(&engine, b, 4 * CHUNK, 2);
    engine.page_out(Target::Buffer(b)).expect("4 host slots, one of them held by the write");
    engine.finish(to_file).unwrap();
    support::assert_contents(&engine, a, &a_bytes);
    support::assert_contents(&engine, b, &b_bytes);
    engine.free(a).unwrap();
    engine.free(b).unwrap();
    support::assert_no_leaks(engine, Some(sim));
}
