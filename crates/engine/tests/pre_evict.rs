//! Pre-eviction (pre_evict.rs): after an acquire, HBM below the free target sends its next
//! victims down at once — clean ones, and dirty ones the peer tier has a free slot for — so
//! that the next missing chunks find room without an eviction in their way; off, nothing
//! leaves before demand. Every byte stays as written.

mod support;

use support::{assert_contents, fill, CHUNK};
use tiermem::{Access, AllocOptions, EngineConfig, Region, StreamHandle, Target, Tier};

const S: StreamHandle = StreamHandle(0);

fn chunks(engine: &tiermem::Engine, tier: Tier) -> usize {
    engine.stats().tiers.get(tier).map_or(0, |t| t.chunks)
}

fn touch(engine: &tiermem::Engine, buffer: tiermem::BufferId, chunk: usize) {
    let region = [Region::bytes(buffer, chunk * CHUNK, CHUNK)];
    engine.acquire(&region, Access::ReadOnly, S).unwrap();
    engine.release(&region, S).unwrap();
}

/// Runs the sequence; returns the evictions made before the second buffer needed room, and
/// those its filling made.
fn run(pre_evict: usize) -> (u64, u64) {
    let config = EngineConfig { pre_evict, peer_clean: false, stride_prefetch: 0, ..support::config() };
    let (engine, sim) = support::engine_with_peers(8, 32, 4, config);
    // Slabs on the lenders, with free slots once the filler is gone.
    let (filler, _) = engine.alloc(4 * CHUNK, AllocOptions::default()).unwrap();
    fill(&engine, filler, 4 * CHUNK, 1);
    engine.page_out(Target::Buffer(filler)).unwrap();
    engine.free(filler).unwrap();
    let (a, _) = engine.alloc(8 * CHUNK, AllocOptions::default()).unwrap();
    let a_data = fill(&engine, a, 8 * CHUNK, 2);
    assert_eq!(chunks(&engine, Tier::Hbm), 8, "HBM full of dirty chunks");
    let before = engine.stats().transfers.evictions;
    touch(&engine, a, 0);
    touch(&engine, a, 0); // reaps what left
    let early = engine.stats().transfers.evictions - before;
    let (b, _) = engine.alloc(2 * CHUNK, AllocOptions::default()).unwrap();
    let before_b = engine.stats().transfers.evictions;
    let b_data = fill(&engine, b, 2 * CHUNK, 3);
    let for_b = engine.stats().transfers.evictions - before_b;
    assert_contents(&engine, a, &a_data);
    assert_contents(&engine, b, &b_data);
    support::assert_no_leaks(engine, Some(sim));
    (early, for_b)
}

#[test]
fn chunks_leave_for_the_peer_tier_before_demand_needs_their_room() {
    let (early, for_b) = run(2 * CHUNK);
    assert_eq!(early, 2, "two dirty chunks went to the free peer slots after the acquire");
    assert_eq!(for_b, 0, "the next two chunks found room");
}

#[test]
fn off_nothing_leaves_before_demand() {
    let (early, for_b) = run(0);
    assert_eq!(early, 0);
    assert_eq!(for_b, 2);
}
