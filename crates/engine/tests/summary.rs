//! `Engine::summary`, what the node daemon's link reads every 50 ms: the statistics without
//! per-buffer residency, whose totals (chunks allocated, chunks acquired in HBM) are kept by
//! the engine rather than counted chunk by chunk.

mod support;

use support::{assert_contents, assert_summary_agrees, fill, CHUNK};
use tiermem::{Access, AllocOptions, Region, StreamHandle, Tier};

#[test]
fn the_summary_counts_what_is_allocated_and_acquired_in_hbm() {
    let (engine, sim) = support::sim_engine(8, 4, 64, support::config());
    let buffers: Vec<_> = (0..3)
        .map(|i| {
            let (id, _) = engine.alloc(2 * CHUNK, AllocOptions::default()).unwrap();
            (id, fill(&engine, id, 2 * CHUNK, 70 + i))
        })
        .collect();
    let summary = engine.summary();
    assert_eq!((summary.allocated_chunks, summary.acquired_in_hbm), (6, 0));
    assert_summary_agrees(&engine);
    // Two buffers acquired at once: the cap of four chunks, all of it acquired.
    let held: Vec<_> = buffers[..2].iter().map(|(id, _)| Region::whole(*id)).collect();
    engine.acquire(&held, Access::ReadWrite, StreamHandle(0)).unwrap();
    let summary = engine.summary();
    assert_eq!(summary.acquired_in_hbm, 4);
    assert_eq!(summary.tiers[Tier::Hbm].chunks, 4);
    assert_summary_agrees(&engine);
    // Acquired twice over, a chunk still counts once.
    engine.acquire(&held[..1], Access::ReadOnly, StreamHandle(0)).unwrap();
    assert_eq!(engine.summary().acquired_in_hbm, 4);
    engine.release(&held[..1], StreamHandle(0)).unwrap();
    engine.release(&held, StreamHandle(0)).unwrap();
    assert_eq!(engine.summary().acquired_in_hbm, 0);
    engine.free(buffers[0].0).unwrap();
    assert_eq!(engine.summary().allocated_chunks, 4);
    assert_summary_agrees(&engine);
    for (id, bytes) in &buffers[1..] {
        assert_contents(&engine, *id, bytes);
        engine.free(*id).unwrap();
    }
    assert_eq!(engine.summary().allocated_chunks, 0);
    support::assert_no_leaks(engine, Some(sim));
}
