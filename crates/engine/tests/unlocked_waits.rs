//! Waits outside the engine's lock: an acquire or an exchange that must wait for eviction's
//! copies down, or a free that must wait for its chunks' transfers, waits with the lock
//! released, so another thread's acquire of resident memory goes on meanwhile.
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
use tiermem::{Access, AllocOptions, BufferId, Engine, Region, StreamHandle, Target};

/// Two chunks of HBM, both taken: `resident` (held acquired by the test, so it stays) and
/// `dirty`; `away` paged out to the host. The GPU then runs work only when the host waits for it.
struct Scene {
    engine: Arc<Engine>,
    sim: Arc<tiermem::mechanism::sim::SimDevice>,
    resident: BufferId,
    dirty: BufferId,
    away: BufferId,
    bytes: [Vec<u8>; 3],
}

fn scene() -> Scene {
    let (engine, sim) = sim_engine(4, 2, 4, support::config());
    let engine = Arc::new(engine);
    let (resident, _) = engine.alloc(CHUNK, AllocOptions::default()).unwrap();
    let (dirty, _) = engine.alloc(CHUNK, AllocOptions::default()).unwrap();
    let (away, _) = engine.alloc(CHUNK, AllocOptions::default()).unwrap();
    let away_bytes = fill(&engine, away, CHUNK, 1);
    engine.page_out(Target::Buffer(away)).unwrap();
    let resident_bytes = fill(&engine, resident, CHUNK, 2);
    let dirty_bytes = fill(&engine, dirty, CHUNK, 3);
    engine.acquire(&[Region::whole(resident)], Access::ReadOnly, StreamHandle(0)).unwrap();
    sim.set_timing(Timing::Lazy);
    Scene { engine, sim, resident, dirty, away, bytes: [resident_bytes, dirty_bytes, away_bytes] }
}

impl Scene {
    /// Runs `op` on a thread of its own, pausing the first host wait for a fence (failpoint
    /// `cuEventSynchronize::wait`); while it is paused, another thread acquires and releases
    /// `resident`, which must complete. Then lets the wait go and returns what `op` returned.
    fn while_a_wait_is_paused<T: Send + 'static>(&self, op: impl FnOnce(&Engine) -> T + Send + 'static) -> T {
        let (at_wait, go) = pause_first("cuEventSynchronize::wait");
        let waiting = {
            let engine = Arc::clone(&self.engine);
            std::thread::spawn(move || op(&engine))
        };
        at_wait.recv_timeout(Duration::from_secs(10)).expect("the call waits for a transfer");
        let (done, finished) = mpsc::channel();
        let cheap = {
            let (engine, resident) = (Arc::clone(&self.engine), self.resident);
            std::thread::spawn(move || {
                let acquired = engine.acquire(&[Region::whole(resident)], Access::ReadOnly, StreamHandle(0));
                let released = engine.release(&[Region::whole(resident)], StreamHandle(0));
                let _ = done.send(acquired.and(released));
            })
        };
        let outcome = finished.recv_timeout(Duration::from_secs(10));
        go.wait();
        fail::remove("cuEventSynchronize::wait");
        outcome.expect("the acquire of resident memory waited for another thread's transfer").unwrap();
        cheap.join().unwrap();
        waiting.join().unwrap()
    }

    /// Releases `resident`, checks every byte of the buffers still live, and that nothing leaked.
    fn check(self, freed: Option<BufferId>) {
        self.engine.release(&[Region::whole(self.resident)], StreamHandle(0)).unwrap();
        self.sim.set_timing(Timing::Eager);
        for (buffer, bytes) in [self.resident, self.dirty, self.away].into_iter().zip(&self.bytes) {
            if Some(buffer) != freed {
                assert_contents(&self.engine, buffer, bytes);
            }
        }
        support::assert_hbm_accounted(&self.engine);
        support::assert_no_leaks(Arc::into_inner(self.engine).unwrap(), Some(self.sim));
    }
}

#[test]
fn an_acquire_of_resident_memory_does_not_wait_for_another_threads_eviction() {
    let (_guard, scenario) = scenario();
    let scene = scene();
    // Bringing `away` in means waiting for `dirty`'s copy down.
    let away = scene.away;
    scene
        .while_a_wait_is_paused(move |engine| {
            engine.acquire(&[Region::whole(away)], Access::ReadOnly, StreamHandle(0))?;
            engine.release(&[Region::whole(away)], StreamHandle(0))
        })
        .unwrap();
    scene.check(None);
    scenario.teardown();
}

#[test]
fn an_acquire_of_resident_memory_does_not_wait_for_another_threads_exchange() {
    let (_guard, scenario) = scenario();
    let scene = scene();
    let (dirty, away) = (scene.dirty, scene.away);
    scene.while_a_wait_is_paused(move |engine| engine.exchange(Target::Buffer(dirty), Target::Buffer(away))).unwrap();
    let stats = |id| support::buffer_stats(&scene.engine, id);
    assert_eq!((stats(away).in_hbm, stats(dirty).in_hbm), (1, 0), "the exchange moved both ways");
    scene.check(None);
    scenario.teardown();
}

#[test]
fn an_acquire_of_resident_memory_does_not_wait_for_another_threads_free() {
    let (_guard, scenario) = scenario();
    let scene = scene();
    // `dirty` is on its way down, its copy not run yet: freeing it waits for the copy.
    let leaving = scene.engine.page_out_start(Target::Buffer(scene.dirty)).unwrap();
    let dirty = scene.dirty;
    scene.while_a_wait_is_paused(move |engine| engine.free(dirty)).unwrap();
    scene.engine.finish(leaving).unwrap();
    assert!(scene.engine.device_ptr(dirty).is_err(), "freed");
    scene.check(Some(dirty));
    scenario.teardown();
}
