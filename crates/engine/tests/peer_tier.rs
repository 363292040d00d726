//! The peer tier on a simulated node of three GPUs: chunks leaving HBM go to the neighbours'
//! lent HBM first, then to the host; lenders take their memory back (on request, or when
//! their free memory falls below the reserve) without losing a byte; one GPU alone, or
//! `TIERMEM_PEERS=off`, has no peer tier and says why.

mod support;

use support::{assert_contents, fill, CHUNK};
use tiermem::mechanism::{ChunkLocation, Device};
use tiermem::{AllocOptions, EngineConfig, PeerChoice, Tier};

const HBM: usize = 4;
const HOST: usize = 16;
const PEER: usize = 4;

fn used(engine: &tiermem::Engine, tier: Tier) -> usize {
    engine.stats().tiers.get(tier).map_or(0, |t| t.chunks)
}

#[test]
fn evicted_chunks_go_to_the_neighbours_first_and_come_back_intact() {
    // No copies to the host in the background: the host tier holds exactly what spilled.
    let config = EngineConfig { peer_clean: false, ..support::config() };
    let (engine, sim) = support::engine_with_peers(HBM, HOST, PEER, config);
    assert_eq!(engine.peer_lenders().len(), 2, "{:?}", engine.peer_notes());
    let (buffer, _) = engine.alloc(12 * CHUNK, AllocOptions::default()).unwrap();
    let data = fill(&engine, buffer, 12 * CHUNK, 7);
    assert_eq!(used(&engine, Tier::Hbm), HBM);
    assert_eq!(used(&engine, Tier::Peer), 2 * PEER, "both neighbours full first");
    assert_eq!(used(&engine, Tier::Host), 12 - HBM - 2 * PEER);
    assert_contents(&engine, buffer, &data);
    // Read back, every chunk came up once more; nothing was written, so evictions were drops.
    let stats = engine.stats();
    assert_eq!(stats.buffers[0].in_peer + stats.buffers[0].in_host + stats.buffers[0].in_hbm, 12);
    support::assert_no_leaks(engine, Some(sim));
}

#[test]
fn a_lender_taking_its_memory_back_loses_nothing() {
    let (engine, sim) = support::engine_with_peers(HBM, HOST, PEER, support::config());
    let (buffer, _) = engine.alloc(12 * CHUNK, AllocOptions::default()).unwrap();
    let data = fill(&engine, buffer, 12 * CHUNK, 11);
    let before = sim.gpu_memory(1).unwrap().free;
    assert_eq!(engine.set_peer_lending(1, 0).unwrap(), PEER * CHUNK);
    assert_eq!(sim.gpu_memory(1).unwrap().free, before + PEER * CHUNK, "GPU 1 has its memory back");
    assert_eq!(used(&engine, Tier::Peer), PEER);
    assert_contents(&engine, buffer, &data);
    assert!(engine.set_peer_lending(2, 0).is_ok());
    assert_eq!(engine.peer_lenders().iter().map(|l| l.2).sum::<usize>(), 0, "nothing borrowed");
    assert_contents(&engine, buffer, &data);
    let e = engine.set_peer_lending(0, CHUNK).unwrap_err().to_string();
    assert!(e.contains("does not lend"), "{e}");
    support::assert_no_leaks(engine, Some(sim));
}

#[test]
fn a_lender_whose_free_memory_collapses_gets_it_back_within_a_poll() {
    let (engine, sim) = support::engine_with_peers(HBM, HOST, PEER, support::config());
    let (buffer, _) = engine.alloc(12 * CHUNK, AllocOptions::default()).unwrap();
    let data = fill(&engine, buffer, 12 * CHUNK, 13);
    // Another program takes all of GPU 1's free memory.
    let free = sim.gpu_memory(1).unwrap().free / CHUNK;
    let taken: Vec<_> = (0..free).map(|_| sim.create_chunk_at(ChunkLocation::Gpu(1)).unwrap()).collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while engine.peer_lenders().iter().any(|&(gpu, _, borrowed)| gpu == 1 && borrowed > 0) {
        assert!(std::time::Instant::now() < deadline, "GPU 1's memory was not given back");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_contents(&engine, buffer, &data);
    taken.into_iter().for_each(|p| sim.release_chunk(p).unwrap());
    support::assert_no_leaks(engine, Some(sim));
}

#[test]
fn without_neighbours_there_is_no_peer_tier_and_the_reason_is_given() {
    let (engine, _sim) = support::sim_engine(HBM + 4, HBM, HOST, support::config());
    assert!(engine.peer_lenders().is_empty());
    assert!(engine.stats().tiers.get(Tier::Peer).is_none());
    assert!(engine.peer_notes().iter().any(|n| n.contains("one GPU")), "{:?}", engine.peer_notes());
    let config = EngineConfig { peers: PeerChoice::Off, ..support::config() };
    let (engine, _sim) = support::engine_with_peers(HBM, HOST, PEER, config);
    assert!(engine.peer_lenders().is_empty());
    assert_eq!(engine.peer_notes(), ["TIERMEM_PEERS=off"]);
    let config = EngineConfig { peers: PeerChoice::Gpus(vec![7]), ..support::config() };
    let mut node = tiermem::mechanism::sim::SimDevice::node(3, 16 * CHUNK).unwrap();
    let device: std::sync::Arc<dyn Device> = std::sync::Arc::new(node.swap_remove(0));
    let e = tiermem::Engine::with_device(device, &config).err().expect("GPU 7 does not exist").to_string();
    assert!(e.contains("GPU 7") && e.contains("3 GPU(s)"), "{e}");
}

#[test]
fn a_peer_budget_is_divided_among_the_lenders_in_whole_slabs_and_met_at_once() {
    let config = EngineConfig { peer_clean: false, ..support::config() };
    let (engine, sim) = support::engine_with_peers(HBM, HOST, PEER, config);
    assert_eq!(engine.peer_offered(), 2 * PEER * CHUNK);
    let (buffer, _) = engine.alloc(12 * CHUNK, AllocOptions::default()).unwrap();
    let data = fill(&engine, buffer, 12 * CHUNK, 17);
    assert_eq!(used(&engine, Tier::Peer), 2 * PEER);
    // One slab's worth: one lender keeps it, the other gives all back.
    assert_eq!(engine.set_peer_budget(PEER * CHUNK + CHUNK).unwrap(), PEER * CHUNK);
    assert_eq!(used(&engine, Tier::Peer), PEER);
    let lent: Vec<usize> = engine.peer_lenders().iter().map(|l| l.1).collect();
    assert_eq!(lent.iter().sum::<usize>(), PEER * CHUNK, "{lent:?}");
    assert_contents(&engine, buffer, &data);
    // Nothing, then everything again (up to what each offered).
    engine.set_peer_budget(0).unwrap();
    assert_eq!(used(&engine, Tier::Peer), 0);
    engine.set_peer_budget(usize::MAX).unwrap();
    assert_eq!(engine.peer_lenders().iter().map(|l| l.1).sum::<usize>(), 2 * PEER * CHUNK);
    assert_contents(&engine, buffer, &data);
    support::assert_no_leaks(engine, Some(sim));
}
