//! Waits outside the engine's lock: an acquire that must wait for eviction's copies down waits
//! with the lock released, so another thread's acquire of resident memory goes on meanwhile.
//! Made certain by pausing the waiting thread inside the device's event wait (failpoint
//! `cuEventSynchronize::wait`) while the simulated GPU runs nothing unless waited for.
//!
//! Run with `cargo test -p tiermem --features failpoints`.
#![cfg(feature = "failpoints")]

mod support;

use std::sync::{mpsc, Arc};
use std::time::Duration;
use support::failpoints::{pause_first, scenario};
use support::{assert_contents, fill, sim_engine, CHUNK};
use tiermem::mechanism::sim::Timing;
use tiermem::{Access, AllocOptions, EngineConfig, Region, StreamHandle, Target};

#[test]
fn an_acquire_of_resident_memory_does_not_wait_for_another_threads_eviction() {
    let (_guard, scenario) = scenario();
    let (engine, sim) = sim_engine(4, 2, 4, EngineConfig::default());
    let engine = Arc::new(engine);
    let (resident, _) = engine.alloc(CHUNK, AllocOptions::default()).unwrap();
    let (dirty, _) = engine.alloc(CHUNK, AllocOptions::default()).unwrap();
    let (away, _) = engine.alloc(CHUNK, AllocOptions::default()).unwrap();
    let away_bytes = fill(&engine, away, CHUNK, 1);
    engine.page_out(Target::Buffer(away)).unwrap();
    let resident_bytes = fill(&engine, resident, CHUNK, 2);
    let dirty_bytes = fill(&engine, dirty, CHUNK, 3);
    // HBM (two chunks) is full; from now on the GPU runs work only when the host waits for it,
    // so bringing `away` in means waiting for an eviction's copy down or last use.
    sim.set_timing(Timing::Lazy);

    // The first host wait for a fence stops until the test lets it go.
    let (at_wait, go) = pause_first("cuEventSynchronize::wait");

    let evicting = {
        let engine = Arc::clone(&engine);
        std::thread::spawn(move || {
            engine.acquire(&[Region::whole(away)], Access::ReadOnly, StreamHandle(0))?;
            engine.release(&[Region::whole(away)], StreamHandle(0))
        })
    };
    at_wait.recv_timeout(Duration::from_secs(10)).expect("the acquire of `away` waits for the eviction");

    // Meanwhile, on another thread, an acquire of what is still resident completes.
    let (done, finished) = mpsc::channel();
    let cheap = {
        let engine = Arc::clone(&engine);
        std::thread::spawn(move || {
            let acquired = engine.acquire(&[Region::whole(resident)], Access::ReadOnly, StreamHandle(0));
            let released = engine.release(&[Region::whole(resident)], StreamHandle(0));
            let _ = done.send(acquired.and(released));
        })
    };
    let outcome = finished.recv_timeout(Duration::from_secs(10));
    go.wait();
    fail::remove("cuEventSynchronize::wait");
    let outcome = outcome.expect("the acquire of resident memory waited for another thread's eviction");
    outcome.unwrap();
    cheap.join().unwrap();
    evicting.join().unwrap().unwrap();

    sim.set_timing(Timing::Eager);
    assert_contents(&engine, away, &away_bytes);
    assert_contents(&engine, resident, &resident_bytes);
    assert_contents(&engine, dirty, &dirty_bytes);
    scenario.teardown();
}
