//! Page-ins from the host tier along several links (multipath.rs), on a simulated node of
//! three GPUs whose neighbours lend: the neighbours' copy engines bring part of each page-in
//! (the simulated device lets a GPU's stream touch only mappings it was given access to, so a
//! missing grant fails here), every byte arrives, and a lender that stops lending stops copying.

mod support;

use support::{assert_contents, fill, CHUNK};
use tiermem::{AllocOptions, EngineConfig, Region, Target, Tier};

const HBM: usize = 16;
const HOST: usize = 48;
const PEER: usize = 4;

/// A buffer of `HBM` chunks whose bytes are in the host tier (the neighbours' HBM full of
/// another buffer's).
fn in_host(engine: &tiermem::Engine, seed: u64) -> (tiermem::BufferId, Vec<u8>) {
    let (filler, _) = engine.alloc(2 * PEER * CHUNK, AllocOptions::default()).unwrap();
    fill(engine, filler, 2 * PEER * CHUNK, seed + 100);
    engine.page_out(Target::Buffer(filler)).unwrap();
    let (buffer, _) = engine.alloc(HBM * CHUNK, AllocOptions::default()).unwrap();
    let data = fill(engine, buffer, HBM * CHUNK, seed);
    engine.page_out(Target::Buffer(buffer)).unwrap();
    let stats = engine.stats();
    let mine = stats.buffers.iter().find(|b| b.id == buffer).unwrap();
    assert_eq!(mine.in_host, HBM, "{stats}");
    (buffer, data)
}

#[test]
fn neighbours_bring_their_part_of_a_page_in_from_the_host_and_every_byte_arrives() {
    let (engine, sim) = support::engine_with_peers(HBM, HOST, PEER, support::config());
    assert!(engine.peer_notes().is_empty(), "{:?}", engine.peer_notes());
    let (buffer, data) = in_host(&engine, 1);
    let before = engine.stats().transfers.by_neighbours;
    engine.page_in(Target::Buffer(buffer)).unwrap();
    let by_neighbours = engine.stats().transfers.by_neighbours - before;
    // Two neighbours and this GPU: a third each (of batches of 16 chunks).
    assert!(by_neighbours >= (HBM as u64) / 2, "{by_neighbours} of {HBM} chunks came by the neighbours");
    assert_contents(&engine, buffer, &data);
    // A demand acquire takes the same paths.
    engine.page_out(Target::Buffer(buffer)).unwrap();
    let whole = [Region::whole(buffer)];
    engine.acquire(&whole, tiermem::Access::ReadOnly, tiermem::StreamHandle(0)).unwrap();
    engine.release(&whole, tiermem::StreamHandle(0)).unwrap();
    assert!(engine.stats().transfers.by_neighbours > before + by_neighbours);
    assert_contents(&engine, buffer, &data);
    support::assert_no_leaks(engine, Some(sim));
}

#[test]
fn a_neighbour_that_stops_lending_stops_copying_and_multipath_off_uses_one_link() {
    let (engine, sim) = support::engine_with_peers(HBM, HOST, PEER, support::config());
    let (buffer, data) = in_host(&engine, 2);
    engine.set_peer_lending(1, 0).unwrap();
    engine.set_peer_lending(2, 0).unwrap();
    assert_eq!(engine.stats().tiers[Tier::Peer].chunks, 0);
    let before = engine.stats().transfers.by_neighbours;
    engine.page_in(Target::Buffer(buffer)).unwrap();
    assert_eq!(engine.stats().transfers.by_neighbours, before, "lending nothing, copying nothing");
    assert_contents(&engine, buffer, &data);
    support::assert_no_leaks(engine, Some(sim));

    let config = EngineConfig { multipath: false, ..support::config() };
    let (engine, sim) = support::engine_with_peers(HBM, HOST, PEER, config);
    let (buffer, data) = in_host(&engine, 3);
    engine.page_in(Target::Buffer(buffer)).unwrap();
    assert_eq!(engine.stats().transfers.by_neighbours, 0);
    assert_contents(&engine, buffer, &data);
    support::assert_no_leaks(engine, Some(sim));
}

#[test]
fn page_ins_along_several_links_lose_nothing_when_driver_calls_fail() {
    for seed in 0..24 {
        let (engine, sim) = support::engine_with_peers(HBM, HOST, PEER, support::config());
        let (buffer, data) = in_host(&engine, seed);
        sim.inject_errors(Some(6), seed);
        for _ in 0..4 {
            let _ = engine.page_in(Target::Buffer(buffer));
            let _ = engine.page_out(Target::Buffer(buffer));
        }
        sim.inject_errors(None, 0);
        assert_contents(&engine, buffer, &data);
        support::assert_no_leaks(engine, Some(sim));
    }
}
