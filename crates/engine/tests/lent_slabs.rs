//! Slabs lent by another process (`tiermem lend` through the node daemon): an engine on GPU 0
//! maps a slab that a second simulated node (standing in for the lender's process) made on its
//! GPU 1 and exported as a file descriptor; chunks leaving HBM go there, the lender's memory
//! really holds their bytes, and returning the slab loses nothing.

mod support;

use std::os::fd::AsFd;
use std::sync::Arc;
use support::{assert_contents, fill, CHUNK};
use tiermem::mechanism::{sim::SimDevice, ChunkLocation, Device};
use tiermem::{AllocOptions, Engine, EngineConfig, PeerChoice, Tier};

const HBM: usize = 4;

fn used(engine: &Engine, tier: Tier) -> usize {
    engine.stats().tiers.get(tier).map_or(0, |t| t.chunks)
}

/// An engine on GPU 0 of a node of two, borrowing from no neighbour by itself.
fn borrower() -> (Engine, Arc<SimDevice>) {
    let config = EngineConfig {
        peers: PeerChoice::Off,
        peer_clean: false,
        hbm_limit: Some(HBM * CHUNK),
        host_limit: Some(64 * CHUNK),
        ..support::config()
    };
    let mut node = SimDevice::node(2, (HBM + 4) * CHUNK).expect("simulated node");
    let sim = Arc::new(node.swap_remove(0));
    let device: Arc<dyn Device> = sim.clone();
    (Engine::with_device(device, &config).expect("engine"), sim)
}

#[test]
fn chunks_go_to_a_lent_slab_and_come_back_intact_when_it_is_returned() {
    let (engine, sim) = borrower();
    let lender_node = SimDevice::node(2, 40 * CHUNK).expect("the lender's node");
    let lender = &lender_node[1];
    let slab = engine.peer_slab_bytes();
    assert_eq!(slab % CHUNK, 0);
    let handle = lender.create_shareable_chunks_at(ChunkLocation::Gpu(1), slab / CHUNK).unwrap();
    let fd = lender.export_chunk(handle).unwrap();
    assert!(engine.adopt_lent_slabs(1, slab, &[(7, fd.as_fd())]).is_empty());
    drop(fd); // the engine holds its own handle now
    assert_eq!(engine.lent_slabs(), vec![7]);

    let chunks = HBM + 8;
    let (buffer, _) = engine.alloc(chunks * CHUNK, AllocOptions::default()).unwrap();
    let data = fill(&engine, buffer, chunks * CHUNK, 21);
    assert_eq!(used(&engine, Tier::Peer), 8, "chunks leaving HBM went to the lent slab first");
    assert_eq!(used(&engine, Tier::Host), 0);

    // The lender's own mapping of its slab holds those chunks' bytes: it is one memory.
    let va = lender.reserve(slab).unwrap();
    lender.map_sized(va, handle, slab).unwrap();
    lender.set_access(va, slab).unwrap();
    let mut seen = vec![0u8; slab];
    lender.read(va, &mut seen).unwrap();
    let found =
        (0..chunks).filter(|&c| seen.chunks(CHUNK).any(|slot| slot == &data[c * CHUNK..(c + 1) * CHUNK])).count();
    assert_eq!(found, 8, "eight of the buffer's chunks are in the lender's memory");

    assert_contents(&engine, buffer, &data);
    assert_eq!(engine.return_lent_slabs(&[7]).unwrap(), vec![7]);
    assert!(engine.lent_slabs().is_empty());
    assert_eq!(used(&engine, Tier::Peer), 0);
    assert_contents(&engine, buffer, &data);
    lender.unmap(va, slab).unwrap();
    lender.unreserve(va, slab).unwrap();
    lender.release_chunk(handle).unwrap();
    engine.free(buffer).unwrap();
    support::assert_no_leaks(engine, Some(sim));
}

#[test]
fn a_slab_that_cannot_be_mapped_is_refused_and_nothing_is_kept() {
    let (engine, sim) = borrower();
    let lender_node = SimDevice::node(2, 40 * CHUNK).expect("the lender's node");
    let lender = &lender_node[1];
    let slab = engine.peer_slab_bytes();
    let handle = lender.create_shareable_chunks_at(ChunkLocation::Gpu(1), slab / CHUNK).unwrap();
    let fd = lender.export_chunk(handle).unwrap();
    // Another size than the engine's slabs, the engine's own GPU, a GPU it cannot reach.
    let wrong_size = engine.adopt_lent_slabs(1, slab / 2, &[(1, fd.as_fd())]);
    assert!(wrong_size[0].1.to_string().contains("maps slabs of"), "{}", wrong_size[0].1);
    for gpu in [0, 5] {
        let refused = engine.adopt_lent_slabs(gpu, slab, &[(2, fd.as_fd())]);
        assert!(refused[0].1.to_string().contains("cannot map memory of GPU"), "{}", refused[0].1);
    }
    // Not an exported allocation at all.
    let file = std::fs::File::open("/dev/null").unwrap();
    assert_eq!(engine.adopt_lent_slabs(1, slab, &[(3, file.as_fd())]).len(), 1);
    assert!(engine.lent_slabs().is_empty());
    assert!(engine.stats().tiers.get(Tier::Peer).is_none_or(|t| t.capacity_bytes == 0));
    // Mapped once: a second time is refused.
    assert!(engine.adopt_lent_slabs(1, slab, &[(4, fd.as_fd())]).is_empty());
    assert_eq!(engine.adopt_lent_slabs(1, slab, &[(4, fd.as_fd())]).len(), 1);
    assert_eq!(engine.return_lent_slabs(&[4, 99]).unwrap(), vec![4], "an id never lent is ignored");
    drop(fd);
    lender.release_chunk(handle).unwrap();
    support::assert_no_leaks(engine, Some(sim));
}
