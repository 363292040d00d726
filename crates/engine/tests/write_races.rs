//! Races between `finish` and other threads over a background file write, made certain by
//! pausing every file write at the failpoint `file_store::write` until the test lets it go.
//! The test here failed before the fix it names: a regression test for a root cause the
//! multi-threaded model test (threads_model.rs, three tiers) found.
//!
//! Failpoints are process-global; this file is its own test process and holds a
//! `FailScenario`. Run with `cargo test -p tiermem --features failpoints`.
#![cfg(feature = "failpoints")]

mod support;

use std::time::Duration;
use support::{fill, sim_engine, CHUNK};
use tiermem::{AllocOptions, EngineConfig, Target};

/// A page-out that needs the host slot a background write still holds, while the write's own
/// ticket is in `finish` on another thread. `finish` used to take the write out of the engine
/// while it waited for it, so the page-out, finding the host tier full of held slots and no
/// write it could complete, failed with "out of memory". Now it completes the write itself
/// and `finish` reports the outcome.
#[test]
fn a_page_out_completes_a_write_that_another_thread_is_finishing() {
    let _scenario = fail::FailScenario::setup();
    let path = support::file_tier_path("finishing");
    let config = EngineConfig { file: Some(path.clone()), file_limit: 16 * CHUNK, ..EngineConfig::default() };
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
}
