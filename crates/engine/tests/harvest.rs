//! Keeping borrowed HBM removable (movement.rs, "Cleaning borrowed chunks"): chunks whose only copy is on a lender are
//! copied to free host room, so giving the lender its memory back copies nothing; those host
//! copies are spares the host tier takes back when it needs room; and the lender watch does
//! it in the background.

mod support;

use support::{assert_contents, fill, CHUNK};
use tiermem::{AllocOptions, EngineConfig, Tier};

const HBM: usize = 4;
const PEER: usize = 4;

fn by_hand() -> EngineConfig {
    EngineConfig { peer_clean: false, ..support::config() }
}

#[test]
fn cleaned_chunks_go_back_to_their_lender_without_a_copy_and_lose_nothing() {
    let (engine, sim) = support::engine_with_peers(HBM, 16, PEER, by_hand());
    let (buffer, _) = engine.alloc(12 * CHUNK, AllocOptions::default()).unwrap();
    let data = fill(&engine, buffer, 12 * CHUNK, 5);
    assert_eq!(engine.stats().tiers[Tier::Peer].chunks, 2 * PEER);
    let host_before = engine.stats().tiers[Tier::Host].chunks;
    assert_eq!(engine.clean_borrowed(3).unwrap(), 3, "at most as many as asked");
    assert_eq!(engine.clean_borrowed(100).unwrap(), 2 * PEER - 3);
    assert_eq!(engine.clean_borrowed(100).unwrap(), 0, "nothing left to clean");
    let stats = engine.stats();
    assert_eq!(stats.transfers.cleaned, 2 * PEER as u64);
    assert_eq!(stats.tiers[Tier::Host].chunks, host_before + 2 * PEER, "one host copy each");
    assert_eq!(stats.buffers[0].in_peer, 2 * PEER, "still read from the peer tier");

    let downs = engine.stats().transfers.page_outs;
    let given = engine.set_peer_lending(1, 0).unwrap() + engine.set_peer_lending(2, 0).unwrap();
    assert_eq!(given, 2 * PEER * CHUNK);
    assert_eq!(engine.stats().transfers.page_outs, downs, "a clean reclaim copies nothing");
    assert_contents(&engine, buffer, &data);
    support::assert_no_leaks(engine, Some(sim));
}

#[test]
fn spare_host_copies_make_room_for_evictions_and_cleaning_uses_only_free_room() {
    // 8 chunks on the lenders, a host tier of 8 with 4 taken.
    let (engine, sim) = support::engine_with_peers(HBM, 8, PEER, by_hand());
    let (a, _) = engine.alloc(12 * CHUNK, AllocOptions::default()).unwrap();
    let a_data = fill(&engine, a, 12 * CHUNK, 6);
    let (b, _) = engine.alloc(2 * CHUNK, AllocOptions::default()).unwrap();
    let b_data = fill(&engine, b, 2 * CHUNK, 7);
    engine.page_out(tiermem::Target::Buffer(b)).unwrap();
    assert_eq!(engine.stats().tiers[Tier::Peer].chunks, 2 * PEER);
    assert_eq!(engine.stats().tiers[Tier::Host].chunks, 4);
    assert_eq!(engine.clean_borrowed(100).unwrap(), 4, "only the free host room");
    assert_eq!(engine.stats().tiers[Tier::Host].chunks, 8);
    // The lenders and the host tier are full; sending HBM's dirty chunks down needs host
    // slots: the spare copies give theirs.
    engine.page_out(tiermem::Target::All).unwrap();
    assert_eq!(engine.stats().tiers[Tier::Hbm].chunks, 0);
    assert_contents(&engine, a, &a_data);
    assert_contents(&engine, b, &b_data);
    support::assert_no_leaks(engine, Some(sim));
}

#[test]
fn the_lender_watch_cleans_in_the_background() {
    let (engine, sim) = support::engine_with_peers(HBM, 16, PEER, support::config());
    let (buffer, _) = engine.alloc(12 * CHUNK, AllocOptions::default()).unwrap();
    let data = fill(&engine, buffer, 12 * CHUNK, 8);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while engine.stats().transfers.cleaned < 2 * PEER as u64 {
        assert!(std::time::Instant::now() < deadline, "nothing cleaned in 10 s: {}", engine.stats());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_contents(&engine, buffer, &data);
    support::assert_no_leaks(engine, Some(sim));
}
