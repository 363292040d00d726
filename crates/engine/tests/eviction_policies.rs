//! Which chunk leaves HBM when a demand needs room, per policy, observed through the transfer
//! counters and per-buffer residency of `Engine::stats` (and every byte checked afterwards).

mod support;

use support::{assert_contents, buffer_stats, fill, CHUNK};
use tiermem::mechanism::Device;
use tiermem::policy::{PolicyKind, LRU_COST_SELECTION_FACTOR};
use tiermem::Tier;
use tiermem::{Access, AllocOptions, BufferId, Counters, Engine, EngineConfig, Region, StreamHandle, Target};

const S: StreamHandle = StreamHandle(0);

fn opts(priority: i32) -> AllocOptions {
    AllocOptions { priority, ..AllocOptions::default() }
}

/// Counter differences `after - before` of the chunk counters that matter here.
fn delta(before: &Counters, after: &Counters) -> (u64, u64, u64) {
    (after.evictions - before.evictions, after.page_outs - before.page_outs, after.clean_drops - before.clean_drops)
}

/// HBM full of old chunks, one clean and one dirty at the old end of the LRU stack. Returns
/// the engine, the (dirty, clean) one-chunk buffers and every buffer with its bytes.
///
/// LRU-COST re-sorts only the oldest `LRU_COST_SELECTION_FACTOR` of the candidates (at least
/// as many as requested); with the 4-chunk cap that would be a window of one chunk, where
/// LRU-COST is LRU. A cap of 10 makes the window the two oldest chunks, so the policies differ.
struct Setup {
    engine: Engine,
    sim: Option<std::sync::Arc<tiermem::mechanism::sim::SimDevice>>,
    dirty: BufferId,
    clean: BufferId,
    all: Vec<(BufferId, Vec<u8>)>,
}

const CAP: usize = 10;

fn old_dirty_and_clean(policy: PolicyKind, dirty_is_oldest: bool) -> Setup {
    assert_eq!((LRU_COST_SELECTION_FACTOR * CAP as f64).ceil() as usize, 2, "the LRU-COST window of this setup");
    let (engine, sim) = support::engine(CAP, 32, EngineConfig { policy, ..support::config() });
    let (dirty, _) = engine.alloc(CHUNK, opts(0)).unwrap();
    let (clean, _) = engine.alloc(CHUNK, opts(0)).unwrap();
    let (filler, _) = engine.alloc((CAP - 2) * CHUNK, opts(0)).unwrap();
    let clean_bytes = fill(&engine, clean, CHUNK, 2);
    engine.page_out(Target::Buffer(clean)).unwrap();
    engine.page_in(Target::Buffer(clean)).unwrap(); // resident with an identical host copy: clean
    let dirty_bytes;
    if dirty_is_oldest {
        dirty_bytes = fill(&engine, dirty, CHUNK, 1);
        touch_read_only(&engine, clean);
    } else {
        touch_read_only(&engine, clean);
        dirty_bytes = fill(&engine, dirty, CHUNK, 1);
    }
    let filler_bytes = fill(&engine, filler, (CAP - 2) * CHUNK, 3); // newer than both
    let stats = engine.stats();
    assert_eq!(stats.tiers[Tier::Hbm].chunks, CAP, "HBM should be full: {stats}");
    assert_eq!(buffer_stats(&engine, clean).in_hbm, 1);
    assert_eq!(buffer_stats(&engine, dirty).in_hbm, 1);
    let all = vec![(dirty, dirty_bytes), (clean, clean_bytes), (filler, filler_bytes)];
    Setup { engine, sim, dirty, clean, all }
}

/// A ReadOnly acquire and release: the chunk is used (recency) and stays clean.
fn touch_read_only(engine: &Engine, buffer: BufferId) {
    engine.acquire(&[Region::whole(buffer)], Access::ReadOnly, S).unwrap();
    engine.release(&[Region::whole(buffer)], S).unwrap();
}

/// Acquires one new chunk (HBM is full, so one chunk must go) and returns the counter deltas.
fn demand_one_chunk(s: &Setup) -> (u64, u64, u64) {
    let before = s.engine.stats().transfers;
    let (fresh, _) = s.engine.alloc(CHUNK, opts(0)).unwrap();
    s.engine.acquire(&[Region::whole(fresh)], Access::ReadWrite, S).unwrap();
    let after = s.engine.stats().transfers;
    s.engine.release(&[Region::whole(fresh)], S).unwrap();
    assert_eq!(after.zero_fills - before.zero_fills, 1);
    delta(&before, &after)
}

fn finish(s: Setup) {
    for (id, bytes) in &s.all {
        assert_contents(&s.engine, *id, bytes);
    }
    support::assert_no_leaks(s.engine, s.sim);
}

#[test]
fn lru_cost_drops_a_clean_chunk_before_an_older_dirty_one() {
    let s = old_dirty_and_clean(PolicyKind::LruCost, true);
    let (evictions, page_outs, clean_drops) = demand_one_chunk(&s);
    assert_eq!(
        (evictions, page_outs, clean_drops),
        (1, 0, 1),
        "LRU-COST should unmap the clean chunk, not copy the dirty one"
    );
    let (dirty, clean) = (buffer_stats(&s.engine, s.dirty), buffer_stats(&s.engine, s.clean));
    assert_eq!((clean.in_hbm, clean.in_host), (0, 1), "the clean chunk should be the victim");
    assert_eq!((dirty.in_hbm, dirty.in_host), (1, 0), "the dirty chunk should stay");
    finish(s);
}

#[test]
fn lru_evicts_the_oldest_chunk_even_when_it_is_dirty() {
    let s = old_dirty_and_clean(PolicyKind::Lru, true);
    let (evictions, page_outs, clean_drops) = demand_one_chunk(&s);
    assert_eq!((evictions, page_outs, clean_drops), (1, 1, 0), "LRU should copy the oldest (dirty) chunk down");
    let (dirty, clean) = (buffer_stats(&s.engine, s.dirty), buffer_stats(&s.engine, s.clean));
    assert_eq!((dirty.in_hbm, dirty.in_host), (0, 1), "the oldest chunk should be the victim");
    assert_eq!((clean.in_hbm, clean.in_host), (1, 0));
    finish(s);
}

#[test]
fn lru_and_lru_cost_both_drop_the_oldest_chunk_when_it_is_clean() {
    for policy in [PolicyKind::Lru, PolicyKind::LruCost] {
        let s = old_dirty_and_clean(policy, false);
        let (evictions, page_outs, clean_drops) = demand_one_chunk(&s);
        assert_eq!((evictions, page_outs, clean_drops), (1, 0, 1), "{policy}");
        assert_eq!(buffer_stats(&s.engine, s.clean).in_hbm, 0, "{policy}");
        assert_eq!(buffer_stats(&s.engine, s.dirty).in_hbm, 1, "{policy}");
        finish(s);
    }
}

#[test]
fn priority_evicts_low_priority_buffers_first() {
    let (engine, sim) = support::engine(4, 16, EngineConfig { policy: PolicyKind::Priority, ..support::config() });
    let (high, _) = engine.alloc(2 * CHUNK, opts(10)).unwrap();
    let (low, _) = engine.alloc(2 * CHUNK, opts(-1)).unwrap();
    // The high-priority buffer is used first, so recency alone would pick it.
    let high_bytes = fill(&engine, high, 2 * CHUNK, 1);
    let low_bytes = fill(&engine, low, 2 * CHUNK, 2);
    assert_eq!(engine.stats().tiers[Tier::Hbm].chunks, 4);

    let (mid, _) = engine.alloc(2 * CHUNK, opts(0)).unwrap();
    let before = engine.stats().transfers;
    let mid_bytes = fill(&engine, mid, 2 * CHUNK, 3);
    let (evictions, page_outs, _) = delta(&before, &engine.stats().transfers);
    assert_eq!((evictions, page_outs), (2, 2));
    let (h, l, m) = (buffer_stats(&engine, high), buffer_stats(&engine, low), buffer_stats(&engine, mid));
    assert_eq!((l.in_hbm, l.in_host), (0, 2), "the low-priority buffer should have been evicted: {}", engine.stats());
    assert_eq!((h.in_hbm, m.in_hbm), (2, 2), "{}", engine.stats());

    // Next, priority 0 goes before priority 10.
    let (top, _) = engine.alloc(CHUNK, opts(5)).unwrap();
    let top_bytes = fill(&engine, top, CHUNK, 4);
    let (h, m) = (buffer_stats(&engine, high), buffer_stats(&engine, mid));
    assert_eq!((h.in_hbm, m.in_hbm, m.in_host), (2, 1, 1), "{}", engine.stats());

    for (id, bytes) in [(high, &high_bytes), (low, &low_bytes), (mid, &mid_bytes), (top, &top_bytes)] {
        assert_contents(&engine, id, bytes);
    }
    support::assert_no_leaks(engine, sim);
}

#[test]
fn paging_out_a_read_only_buffer_again_costs_no_copy() {
    let (engine, sim) = support::engine(4, 8, support::config());
    let ro_opts = AllocOptions { read_only: true, ..AllocOptions::default() };
    let size = 2 * CHUNK - 300;
    let (ro, _) = engine.alloc(size, ro_opts).unwrap();
    let bytes = fill(&engine, ro, size, 7);

    let t0 = engine.stats().transfers;
    engine.page_out(Target::Buffer(ro)).unwrap();
    let t1 = engine.stats().transfers;
    assert_eq!((t1.page_outs - t0.page_outs, t1.clean_drops - t0.clean_drops), (2, 0), "the first page_out copies");
    assert_eq!(buffer_stats(&engine, ro).in_host, 2);

    for round in 0..2 {
        engine.page_in(Target::Buffer(ro)).unwrap();
        assert_eq!(buffer_stats(&engine, ro).in_hbm, 2);
        if round == 1 {
            touch_read_only(&engine, ro); // a ReadOnly acquire keeps it clean
        }
        let before = engine.stats().transfers;
        engine.page_out(Target::Buffer(ro)).unwrap();
        let after = engine.stats().transfers;
        assert_eq!(after.page_outs, before.page_outs, "round {round}: a clean page_out copied");
        assert_eq!(after.clean_drops - before.clean_drops, 2, "round {round}");
        let s = buffer_stats(&engine, ro);
        assert_eq!((s.in_hbm, s.in_host), (0, 2), "round {round}");
        assert_contents(&engine, ro, &bytes);
        engine.page_out(Target::Buffer(ro)).unwrap();
    }
    support::assert_no_leaks(engine, sim);
}

#[test]
fn the_pool_evicts_when_the_device_has_fewer_chunks_than_the_cap() {
    // The device has 6 chunks and the cap says 6, but someone else holds 3 of them: cuMemCreate
    // runs out of memory at the 4th, and the pool must shrink its cap and evict instead of failing.
    let sim = std::sync::Arc::new(tiermem::mechanism::sim::SimDevice::new(6 * CHUNK).unwrap());
    let others: Vec<_> = (0..3).map(|_| sim.create_chunk().unwrap()).collect();
    let config = EngineConfig { hbm_limit: Some(6 * CHUNK), host_limit: Some(16 * CHUNK), ..support::config() };
    let engine = Engine::with_device(sim.clone(), &config).unwrap();
    let (a, _) = engine.alloc(3 * CHUNK, AllocOptions::default()).unwrap();
    let (b, _) = engine.alloc(2 * CHUNK, AllocOptions::default()).unwrap();
    let a_bytes = fill(&engine, a, 3 * CHUNK, 1);
    let b_bytes = fill(&engine, b, 2 * CHUNK, 2);
    let stats = engine.stats();
    assert_eq!(stats.tiers[Tier::Hbm].chunks, 3, "{stats}");
    assert_eq!(stats.transfers.evictions, 2, "{stats}");
    assert_eq!(buffer_stats(&engine, b).in_hbm, 2);
    assert_contents(&engine, a, &a_bytes);
    assert_contents(&engine, b, &b_bytes);
    drop(engine);
    others.into_iter().for_each(|chunk| sim.release_chunk(chunk).unwrap());
    assert!(sim.live().is_empty(), "{:?}", sim.live());
}
