//! An engine told to wait for its budget (`Engine::wait_for_budget`, as the tenant link does):
//! an acquire larger than the budget waits until the budget grows, then goes through with
//! every byte; one whose budget never grows fails after the wait with the usual error, and
//! one larger than the engine's own cap at once; one that finds every chunk acquired goes
//! through once another thread releases. Without the
//! wait, both fail at once as before. Runs on the GPU too.

mod support;

use std::time::{Duration, Instant};
use support::{assert_contents, fill, CHUNK};
use tiermem::{Access, AllocOptions, Error, Region, StreamHandle};

const S: StreamHandle = StreamHandle(0);

#[test]
fn an_acquire_larger_than_the_budget_waits_for_it_to_grow() {
    let (engine, sim) = support::engine(8, 32, support::config());
    let (id, _) = engine.alloc(6 * CHUNK, AllocOptions::default()).unwrap();
    let bytes = fill(&engine, id, 6 * CHUNK, 5);
    engine.finish(engine.set_hbm_budget(2 * CHUNK).unwrap()).unwrap();
    let region = [Region::whole(id)];
    // No wait: refused at once, as a standalone engine always was.
    let refused = engine.acquire(&region, Access::ReadOnly, S);
    assert!(matches!(refused, Err(Error::WouldNeverFit { .. })), "{refused:?}");

    engine.wait_for_budget(Duration::from_secs(20));
    std::thread::scope(|scope| {
        let grower = scope.spawn(|| {
            std::thread::sleep(Duration::from_millis(200));
            engine.finish(engine.set_hbm_budget(8 * CHUNK).unwrap()).unwrap();
        });
        let started = Instant::now();
        engine.acquire(&region, Access::ReadOnly, S).unwrap();
        assert!(started.elapsed() >= Duration::from_millis(150), "it waited for the budget");
        engine.release(&region, S).unwrap();
        grower.join().unwrap();
    });
    assert_contents(&engine, id, &bytes);

    // Larger than the engine's own cap (8 chunks): no budget would ever fit it, so it fails at
    // once, waiting or not, and the error names that cap rather than the budget of the moment.
    let (huge, _) = engine.alloc(12 * CHUNK, AllocOptions::default()).unwrap();
    engine.finish(engine.set_hbm_budget(2 * CHUNK).unwrap()).unwrap();
    let started = Instant::now();
    let refused = engine.acquire(&[Region::whole(huge)], Access::ReadOnly, S);
    assert!(started.elapsed() < Duration::from_secs(5), "it did not wait for nothing");
    match refused {
        Err(Error::WouldNeverFit { requested, cap, .. }) => assert_eq!((requested, cap), (12 * CHUNK, 8 * CHUNK)),
        other => panic!("{other:?}"),
    }
    engine.free(huge).unwrap();

    // A budget that never grows: the usual error, after the wait.
    engine.wait_for_budget(Duration::from_millis(300));
    engine.finish(engine.set_hbm_budget(2 * CHUNK).unwrap()).unwrap();
    let started = Instant::now();
    let refused = engine.acquire(&region, Access::ReadOnly, S);
    assert!(matches!(refused, Err(Error::WouldNeverFit { .. })), "{refused:?}");
    assert!(started.elapsed() >= Duration::from_millis(250));
    engine.free(id).unwrap();
    support::assert_no_leaks(engine, sim);
}

#[test]
fn an_acquire_that_finds_every_chunk_acquired_goes_through_once_one_is_released() {
    // A budget of 4 of the engine's 8 chunks (at its full cap it would not wait: see below).
    let (engine, sim) = support::engine(8, 32, support::config());
    engine.finish(engine.set_hbm_budget(4 * CHUNK).unwrap()).unwrap();
    let (held, _) = engine.alloc(4 * CHUNK, AllocOptions::default()).unwrap();
    let (wanted, _) = engine.alloc(2 * CHUNK, AllocOptions::default()).unwrap();
    let bytes = fill(&engine, wanted, 2 * CHUNK, 9);
    let held_region = [Region::whole(held)];
    engine.acquire(&held_region, Access::ReadWrite, S).unwrap();
    let region = [Region::whole(wanted)];
    let refused = engine.acquire(&region, Access::ReadOnly, S);
    assert!(matches!(refused, Err(Error::OutOfMemory { .. })), "{refused:?}");

    engine.wait_for_budget(Duration::from_secs(20));
    std::thread::scope(|scope| {
        let releaser = scope.spawn(|| {
            std::thread::sleep(Duration::from_millis(200));
            engine.release(&held_region, S).unwrap();
        });
        engine.acquire(&region, Access::ReadOnly, S).unwrap();
        engine.release(&region, S).unwrap();
        releaser.join().unwrap();
    });
    assert_contents(&engine, wanted, &bytes);

    // At the engine's full cap nothing can help an acquire that finds every chunk acquired:
    // it fails at once, waiting or not.
    engine.finish(engine.set_hbm_budget(8 * CHUNK).unwrap()).unwrap();
    let (more, _) = engine.alloc(4 * CHUNK, AllocOptions::default()).unwrap();
    engine.acquire(&held_region, Access::ReadWrite, S).unwrap();
    engine.acquire(&[Region::whole(more)], Access::ReadWrite, S).unwrap();
    let started = Instant::now();
    let refused = engine.acquire(&region, Access::ReadOnly, S);
    assert!(matches!(refused, Err(Error::OutOfMemory { .. })), "{refused:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "it did not wait for nothing");
    engine.release(&held_region, S).unwrap();
    engine.release(&[Region::whole(more)], S).unwrap();
    engine.free(more).unwrap();
    for id in [held, wanted] {
        engine.free(id).unwrap();
    }
    support::assert_no_leaks(engine, sim);
}
