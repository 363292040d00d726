//! `release_idle_hbm` gives idle physical chunks back to the driver (a model put to sleep
//! frees its HBM for other users of the GPU): no byte is lost, chunks still in use stay, and
//! later page-ins create chunks afresh.

mod support;

use support::{assert_contents, assert_no_leaks, fill, CHUNK};
use tiermem::{Access, AllocOptions, Region, StreamHandle, Target};

const S: StreamHandle = StreamHandle(0);

#[test]
fn released_hbm_comes_back_on_page_in_with_every_byte() {
    let (engine, sim) = support::engine(4, 16, support::config());
    let e = &engine;
    let (a, _) = e.alloc(6 * CHUNK, AllocOptions::default()).unwrap();
    let (b, _) = e.alloc(CHUNK + 5, AllocOptions { read_only: true, ..Default::default() }).unwrap();
    let bytes_a = fill(e, a, 6 * CHUNK, 1);
    let bytes_b = fill(e, b, CHUNK + 5, 2);
    // Filling 7 chunks through a cap of 4 left stale mappings of chunks now held by others.
    e.page_out(Target::All).unwrap();
    let released = e.release_idle_hbm().unwrap();
    assert_eq!(released, 4 * CHUNK, "every created chunk was idle");
    if let Some(sim) = &sim {
        let live = sim.live();
        assert_eq!((live.chunks, live.mapped_chunks), (0, 0), "nothing physical left: {live:?}");
    }
    assert_eq!(e.release_idle_hbm().unwrap(), 0, "nothing left to give back");
    assert_contents(e, a, &bytes_a);
    assert_contents(e, b, &bytes_b);

    // Chunks in use (acquired, or resident) stay; only the idle ones go.
    e.page_out(Target::All).unwrap();
    e.page_in(Target::Buffer(b)).unwrap();
    e.acquire(&[Region::bytes(a, 0, CHUNK)], Access::ReadOnly, S).unwrap();
    let in_use = 3; // two chunks of b, one of a
    let released = e.release_idle_hbm().unwrap();
    assert!(released <= (4 - in_use) * CHUNK, "released {released} bytes with {in_use} chunks in use");
    if let Some(sim) = &sim {
        assert_eq!(sim.live().chunks, in_use, "the chunks in use stay");
    }
    e.release(&[Region::bytes(a, 0, CHUNK)], S).unwrap();
    let ticket = e.page_in_start(Target::Buffer(b)).unwrap();
    e.finish(ticket).unwrap();
    assert_contents(e, a, &bytes_a);
    assert_contents(e, b, &bytes_b);
    assert_no_leaks(engine, sim);
}

/// A page-in larger than a batch after the HBM went back to the driver (the engine then brings
/// a demand in batch by batch, so the chunks are made while earlier copies run): every chunk
/// comes in with every byte; a page-in that must evict (in one go) keeps them too.
#[test]
fn a_page_in_of_many_batches_keeps_every_batch_and_byte() {
    let (engine, sim) = support::engine(24, 64, support::config());
    let e = &engine;
    let (big, _) = e.alloc(20 * CHUNK, AllocOptions::default()).unwrap();
    let (other, _) = e.alloc(10 * CHUNK, AllocOptions::default()).unwrap();
    let bytes_big = fill(e, big, 20 * CHUNK, 3);
    let bytes_other = fill(e, other, 10 * CHUNK, 4);
    e.page_out(Target::All).unwrap();
    e.release_idle_hbm().unwrap();
    e.page_in(Target::Buffer(big)).unwrap();
    let in_hbm = |id| e.stats().buffers.iter().find(|b| b.id == id).map_or(0, |b| b.in_hbm);
    assert_eq!(in_hbm(big), 20, "every chunk of the batched page-in is resident");
    assert_contents(e, big, &bytes_big);
    // 20 resident + 10 wanted > 24: this one evicts.
    e.page_in(Target::Buffer(other)).unwrap();
    assert_eq!(in_hbm(other), 10);
    assert_contents(e, big, &bytes_big);
    assert_contents(e, other, &bytes_other);
    assert_no_leaks(engine, sim);
}
