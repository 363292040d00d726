//! Everything the engine takes from the device comes back: VA reservations, physical chunks
//! and their mappings, pinned host memory, streams and events, counted by the simulated
//! device (on a real GPU, `TIERMEM_TEST_BACKEND=cuda`, these tests only check the data).

mod support;

use support::{assert_contents, buffer_stats, fill, CHUNK};
use tiermem::policy::PolicyKind;
use tiermem::Tier;
use tiermem::{Access, AllocOptions, BufferId, EngineConfig, Error, Region, StreamHandle, Target};

const S: StreamHandle = StreamHandle(0);

#[test]
fn a_mixed_workload_gives_everything_back() {
    for policy in PolicyKind::ALL {
        let (engine, sim) = support::engine(4, 16, EngineConfig { policy, batch_chunks: 2, ..support::config() });
        let e = &engine;
        let mut live: Vec<(BufferId, Vec<u8>)> = Vec::new();
        for round in 0..3u64 {
            let sizes = [3 * CHUNK + 17, CHUNK, 2 * CHUNK - 1];
            for (k, &size) in sizes.iter().enumerate() {
                let read_only = k == 1;
                let (id, _) =
                    e.alloc(size, AllocOptions { read_only, priority: k as i32, ..AllocOptions::default() }).unwrap();
                live.push((id, fill(e, id, size, round * 10 + k as u64)));
            }
            // Kernel-style writes through the device pointer while acquired.
            let (id, bytes) = live.iter_mut().find(|(id, _)| !buffer_stats(e, *id).read_only).unwrap();
            let region = [Region::bytes(*id, CHUNK - 8, 16)];
            e.acquire(&region, Access::ReadWrite, S).unwrap();
            let patch = support::pattern(round + 100, 16);
            e.device().write(e.device_ptr(*id).unwrap() + (CHUNK - 8) as u64, &patch).unwrap();
            e.release(&region, S).unwrap();
            bytes[CHUNK - 8..CHUNK + 8].copy_from_slice(&patch);
            // Moves of every kind.
            let first = live[live.len() - 3].0;
            e.page_out(Target::Buffer(first)).unwrap();
            e.prefetch(&[Region::whole(first)]).unwrap();
            let ticket = e.page_out_start(Target::All).unwrap();
            e.finish(ticket).unwrap();
            let last = live.last().unwrap().0;
            e.page_in(Target::Buffer(last)).unwrap();
            let ticket = e.page_in_start(Target::Buffer(first)).unwrap();
            e.finish(ticket).unwrap();
            // Some errors on the way, which must not leak either.
            assert!(matches!(
                e.acquire(&[Region::whole(first), Region::whole(last)], Access::ReadOnly, S),
                Err(Error::WouldNeverFit { .. })
            ));
            e.acquire(&[Region::whole(first)], Access::ReadOnly, S).unwrap();
            assert!(matches!(e.acquire(&[Region::whole(last)], Access::ReadOnly, S), Err(Error::OutOfMemory { .. })));
            assert!(matches!(e.free(first), Err(Error::Acquired { .. })));
            e.release(&[Region::whole(first)], S).unwrap();
            for (id, bytes) in &live {
                assert_contents(e, *id, bytes);
            }
            // Free two of the three buffers of this round, keep one.
            let (a, _) = live.remove(live.len() - 3);
            let (b, _) = live.pop().unwrap();
            e.free(a).unwrap();
            e.free(b).unwrap();
            if let Some(sim) = &sim {
                assert_eq!(sim.live().reservations, live.len(), "{policy}: reservations of freed buffers remain");
            }
        }
        for (id, _) in live.drain(..) {
            e.free(id).unwrap();
        }
        let stats = e.stats();
        assert_eq!(
            (stats.tiers[Tier::Hbm].chunks, stats.tiers[Tier::Host].chunks),
            (0, 0),
            "{policy}: chunks in use with no buffer: {stats}"
        );
        if let Some(sim) = &sim {
            let now = sim.live();
            assert_eq!((now.reservations, now.mapped_chunks), (0, 0), "{policy}: {now:?}");
        }
        support::assert_no_leaks(engine, sim);
    }
}

#[test]
fn dropping_the_engine_with_buffers_allocated_acquired_and_moving_releases_everything() {
    let (engine, sim) = support::engine(4, 16, EngineConfig { batch_chunks: 1, ..support::config() });
    let e = &engine;
    let mut ids = Vec::new();
    for (k, size) in [2 * CHUNK, 3 * CHUNK, CHUNK + 5, 4 * CHUNK].into_iter().enumerate() {
        let (id, _) = e.alloc(size, AllocOptions { read_only: k == 2, ..AllocOptions::default() }).unwrap();
        fill(e, id, size, k as u64);
        ids.push(id);
    }
    let (never_touched, _) = e.alloc(5 * CHUNK, AllocOptions::default()).unwrap();
    ids.push(never_touched);
    // Clean chunks (paged in after a page-out), a ticket never finished, pins held.
    e.page_out(Target::Buffer(ids[2])).unwrap();
    e.page_in(Target::Buffer(ids[2])).unwrap();
    let _unfinished = e.page_out_start(Target::Buffer(ids[0])).unwrap();
    e.acquire(&[Region::bytes(ids[2], 0, 10)], Access::ReadOnly, S).unwrap();
    e.acquire(&[Region::bytes(ids[2], 0, 10)], Access::ReadOnly, S).unwrap();
    e.acquire(&[Region::bytes(ids[1], CHUNK, 10)], Access::ReadWrite, S).unwrap();
    e.prefetch(&[Region::whole(ids[3])]).unwrap();
    let stats = e.stats();
    assert!(stats.buffers.iter().map(|b| b.acquired).sum::<usize>() == 2, "{stats}");
    assert!(stats.tiers[Tier::Host].chunks > 0 && stats.tiers[Tier::Hbm].chunks > 0, "{stats}");
    if let Some(sim) = &sim {
        assert_eq!(sim.live().reservations, 5);
    }
    support::assert_no_leaks(engine, sim);
}

#[test]
fn dropping_an_engine_that_never_did_anything_releases_everything() {
    let (engine, sim) = support::engine(4, 16, support::config());
    support::assert_no_leaks(engine, sim);
    let (engine, sim) = support::engine(4, 16, support::config());
    let (id, _) = engine.alloc(3 * CHUNK, AllocOptions::default()).unwrap();
    assert_eq!(buffer_stats(&engine, id).empty, 3);
    support::assert_no_leaks(engine, sim);
}
