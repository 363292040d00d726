//! Lenders whose own kernels run (peer_traffic.rs): on a simulated node of three GPUs whose
//! neighbours lend, a neighbour reported busy takes new chunks only as fast as
//! `TIERMEM_PEER_BUSY_RATE` allows (none at a rate of 0), carries no page-ins from host memory
//! and is not read by background cleaning; chunks already there are read back intact; idle
//! again, it takes everything as before.

mod support;

use std::time::Instant;
use support::{assert_contents, fill, CHUNK};
use tiermem::{AllocOptions, EngineConfig, Target, Tier};

const HBM: usize = 16;
const HOST: usize = 64;
const PEER: usize = 8;

fn config(rate: usize) -> EngineConfig {
    EngineConfig { peer_busy_rate: Some(rate), peer_clean: false, ..support::config() }
}

fn set_busy(engine: &tiermem::Engine, sim: &tiermem::mechanism::sim::SimDevice, percent: u32) {
    sim.set_busy(1, percent);
    sim.set_busy(2, percent);
    engine.watch_lenders().unwrap();
}

#[test]
fn a_busy_lender_at_rate_zero_takes_no_new_chunks_and_idle_again_takes_them() {
    let (engine, sim) = support::engine_with_peers(HBM, HOST, PEER, config(0));
    set_busy(&engine, &sim, 100);
    assert_eq!(engine.busy_lenders(), vec![1, 2]);
    let (a, _) = engine.alloc(HBM * CHUNK, AllocOptions::default()).unwrap();
    let a_data = fill(&engine, a, HBM * CHUNK, 1);
    engine.page_out(Target::Buffer(a)).unwrap();
    let stats = engine.stats();
    assert_eq!(stats.tiers[Tier::Peer].chunks, 0, "busy lenders took chunks: {stats}");
    assert_eq!(stats.tiers[Tier::Host].chunks, HBM);
    // Page-ins from the host come along this GPU's link alone.
    let before = stats.transfers.by_neighbours;
    engine.page_in(Target::Buffer(a)).unwrap();
    assert_eq!(engine.stats().transfers.by_neighbours, before, "a busy lender's link carried a page-in");
    assert_contents(&engine, a, &a_data);

    // A lender below the threshold is idle: it takes chunks and copies page-ins again.
    set_busy(&engine, &sim, 5);
    assert!(engine.busy_lenders().is_empty());
    let (b, _) = engine.alloc(HBM * CHUNK, AllocOptions::default()).unwrap();
    let b_data = fill(&engine, b, HBM * CHUNK, 2);
    engine.page_out(Target::All).unwrap();
    assert_eq!(engine.stats().tiers[Tier::Peer].chunks, 2 * PEER, "{}", engine.stats());

    // Busy again, with chunks there: they are read back, cleaning leaves them, new ones go to host.
    set_busy(&engine, &sim, 100);
    assert_eq!(engine.clean_borrowed(100).unwrap(), 0, "cleaning read a busy lender");
    for buffer in [a, b] {
        engine.page_in(Target::Buffer(buffer)).unwrap();
        engine.page_out(Target::Buffer(buffer)).unwrap();
    }
    assert!(engine.stats().tiers[Tier::Peer].chunks <= 2 * PEER);
    assert_contents(&engine, a, &a_data);
    assert_contents(&engine, b, &b_data);
    support::assert_no_leaks(engine, Some(sim));
}

#[test]
fn a_busy_lender_takes_no_more_than_its_burst_and_rate() {
    // Two chunks a second: the bucket holds one chunk (its burst).
    let rate = 2 * CHUNK;
    let (engine, sim) = support::engine_with_peers(HBM, HOST, PEER, config(rate));
    let (a, _) = engine.alloc(HBM * CHUNK, AllocOptions::default()).unwrap();
    let a_data = fill(&engine, a, HBM * CHUNK, 3);
    let start = Instant::now();
    set_busy(&engine, &sim, 100);
    engine.page_out(Target::Buffer(a)).unwrap();
    let peer = engine.stats().tiers[Tier::Peer].chunks;
    let most = 2 * (1 + (start.elapsed().as_secs_f64() * 2.0).ceil() as usize);
    assert!(peer <= most, "{peer} chunks went to two busy lenders in {:?}; at most {most}", start.elapsed());
    assert!(peer >= 1, "the burst passes");
    assert_contents(&engine, a, &a_data);
    support::assert_no_leaks(engine, Some(sim));
}

#[test]
fn the_busy_rate_setting_reads_rates_and_off() {
    let parse = |v: &str| {
        std::env::set_var("TIERMEM_PEER_BUSY_RATE", v);
        let c = EngineConfig::from_env().map(|c| c.peer_busy_rate);
        std::env::remove_var("TIERMEM_PEER_BUSY_RATE");
        c
    };
    assert_eq!(parse("32GiB/s").unwrap(), Some(32 << 30));
    assert_eq!(parse("1M").unwrap(), Some(1 << 20));
    assert_eq!(parse("off").unwrap(), None);
    let err = parse("fast").unwrap_err().to_string();
    assert!(err.contains("TIERMEM_PEER_BUSY_RATE") && err.contains("64GiB/s"), "{err}");
}
