//! Reading in place on a simulated node of three GPUs, borrowed HBM made one allocation per
//! chunk (`TIERMEM_PEER_IN_PLACE`): chunks the peer tier holds are read
//! where they lie (`Access::InPlaceOk`, or a buffer made `in_place`), mapped once and then
//! acquired with no copy and no driver call; they come into HBM when written, go back to the
//! host when their lender wants its memory, and lose no byte on any of these paths.

mod support;

use support::{assert_contents, fill, CHUNK};
use tiermem::mechanism::Device;
use tiermem::{Access, AllocOptions, Engine, EngineConfig, Error, Region, StreamHandle};

const HBM: usize = 4;
const HOST: usize = 16;
const PEER: usize = 4;
const S: StreamHandle = StreamHandle(0);

/// Borrowed HBM made readable in place (`TIERMEM_PEER_IN_PLACE=on`).
fn in_place() -> EngineConfig {
    EngineConfig { peer_in_place: true, ..support::config() }
}

/// A buffer of HBM + both lenders' chunks, filled chunk by chunk: its first eight chunks are in
/// the peer tier, its last four in HBM.
fn spread(engine: &Engine, options: AllocOptions, seed: u64) -> (tiermem::BufferId, Vec<u8>) {
    let size = (HBM + 2 * PEER) * CHUNK;
    let (buffer, _) = engine.alloc(size, options).unwrap();
    let data = fill(engine, buffer, size, seed);
    let stats = support::buffer_stats(engine, buffer);
    assert_eq!((stats.in_hbm, stats.in_peer), (HBM, 2 * PEER));
    (buffer, data)
}

/// Reads `region` through its device address while acquired, as a kernel would.
fn device_bytes(engine: &Engine, device: &dyn Device, region: Region) -> Vec<u8> {
    let mut out = vec![0u8; region.len.unwrap()];
    device.read(engine.device_ptr(region.buffer).unwrap() + region.offset as u64, &mut out).unwrap();
    out
}

#[test]
fn chunks_in_the_peer_tier_are_read_where_they_lie_mapped_once() {
    let (engine, sim) = support::engine_with_peers(HBM, HOST, PEER, in_place());
    let (buffer, data) = spread(&engine, AllocOptions::default(), 3);
    let whole = Region::bytes(buffer, 0, data.len());
    let before = engine.stats().transfers;
    // Three times the HBM cap, acquired at once: what does not fit is read in place.
    engine.acquire(&[whole], Access::InPlaceOk, S).unwrap();
    assert_eq!(device_bytes(&engine, sim.as_ref(), whole), data);
    let stats = engine.stats();
    assert_eq!(stats.transfers.in_place_maps - before.in_place_maps, 2 * PEER as u64);
    assert_eq!(stats.transfers.page_ins, before.page_ins, "nothing was copied");
    assert_eq!((stats.buffers[0].in_place, stats.buffers[0].acquired), (2 * PEER, HBM + 2 * PEER));
    assert_eq!(stats.tiers[tiermem::Tier::Hbm].chunks, HBM, "reading in place takes no HBM");
    engine.release(&[whole], S).unwrap();
    // A prefetch leaves chunks mapped in place where they are.
    engine.prefetch(&[whole]).unwrap();
    assert_eq!(support::buffer_stats(&engine, buffer).in_place, 2 * PEER);
    // Again: no driver call, no copy.
    engine.acquire(&[whole], Access::InPlaceOk, S).unwrap();
    assert_eq!(device_bytes(&engine, sim.as_ref(), whole), data);
    engine.release(&[whole], S).unwrap();
    let after = engine.stats().transfers;
    assert_eq!((after.in_place_maps, after.page_ins), (stats.transfers.in_place_maps, before.page_ins));
    assert_eq!(after.in_place_reads - before.in_place_reads, 4 * PEER as u64);
    assert_contents(&engine, buffer, &data);
    support::assert_no_leaks(engine, Some(sim));
}

#[test]
fn free_hbm_is_used_first_and_a_plain_read_brings_chunks_in() {
    let (engine, sim) = support::engine_with_peers(HBM, HOST, PEER, in_place());
    let (buffer, data) = spread(&engine, AllocOptions::default(), 5);
    // HBM freed: a read that allows it in place still copies what fits.
    engine.page_out(tiermem::Target::Buffer(buffer)).unwrap();
    let head = Region::bytes(buffer, 0, 2 * PEER * CHUNK);
    engine.acquire(&[head], Access::InPlaceOk, S).unwrap();
    let stats = support::buffer_stats(&engine, buffer);
    assert_eq!((stats.in_hbm, stats.in_place), (HBM, 2 * PEER - HBM), "free HBM first");
    assert_eq!(device_bytes(&engine, sim.as_ref(), head), data[..2 * PEER * CHUNK]);
    engine.release(&[head], S).unwrap();
    // Plain reads never read in place: a chunk mapped in place comes into HBM, intact.
    let one = Region::bytes(buffer, (2 * PEER - 1) * CHUNK, CHUNK);
    engine.acquire(&[one], Access::ReadOnly, S).unwrap();
    assert_eq!(support::buffer_stats(&engine, buffer).in_place, 2 * PEER - HBM - 1);
    assert_eq!(device_bytes(&engine, sim.as_ref(), one), data[(2 * PEER - 1) * CHUNK..2 * PEER * CHUNK]);
    engine.release(&[one], S).unwrap();
    assert_contents(&engine, buffer, &data);
    support::assert_no_leaks(engine, Some(sim));
}

#[test]
fn writing_a_chunk_read_in_place_is_refused_until_released_then_it_comes_into_hbm() {
    let (engine, sim) = support::engine_with_peers(HBM, HOST, PEER, in_place());
    let (buffer, mut data) = spread(&engine, AllocOptions::default(), 7);
    let last = Region::bytes(buffer, 0, CHUNK);
    engine.acquire(&[last], Access::InPlaceOk, S).unwrap();
    assert_eq!(support::buffer_stats(&engine, buffer).in_place, 1);
    // A plain read of it while held in place is served there too; a write is refused.
    engine.acquire(&[last], Access::ReadOnly, S).unwrap();
    engine.release(&[last], S).unwrap();
    let e = engine.acquire(&[last], Access::ReadWrite, S).unwrap_err();
    assert_eq!(e, Error::AcquiredInPlace { call: "acquire", buffer });
    assert!(e.to_string().contains("release them"), "{e}");
    let e = engine.write(buffer, last.offset, &[1u8; 8]).unwrap_err();
    assert!(matches!(e, Error::AcquiredInPlace { call: "write", .. }), "{e}");
    engine.release(&[last], S).unwrap();
    // Released, it is written in HBM; its peer copy is dropped.
    engine.acquire(&[last], Access::ReadWrite, S).unwrap();
    let fresh = support::pattern(99, CHUNK);
    sim.write(engine.device_ptr(buffer).unwrap() + last.offset as u64, &fresh).unwrap();
    engine.release(&[last], S).unwrap();
    data[..CHUNK].copy_from_slice(&fresh);
    assert_contents(&engine, buffer, &data);
    support::assert_no_leaks(engine, Some(sim));
}

#[test]
fn a_lender_takes_back_memory_read_in_place_once_it_is_released() {
    let (engine, sim) = support::engine_with_peers(HBM, HOST, PEER, in_place());
    let (buffer, data) = spread(&engine, AllocOptions { in_place: true, ..AllocOptions::default() }, 11);
    let tail = Region::bytes(buffer, 0, 2 * PEER * CHUNK);
    // The buffer allows it: plain reads are read in place.
    engine.acquire(&[tail], Access::ReadOnly, S).unwrap();
    assert_eq!(support::buffer_stats(&engine, buffer).in_place, 2 * PEER);
    engine.release(&[tail], S).unwrap();
    // Mapped in place but not acquired: GPU 1's slab goes back at once.
    let free_1 = sim.gpu_memory(1).unwrap().free;
    assert_eq!(engine.set_peer_lending(1, 0).unwrap(), PEER * CHUNK);
    assert_eq!(sim.gpu_memory(1).unwrap().free, free_1 + PEER * CHUNK);
    assert_eq!(support::buffer_stats(&engine, buffer).in_place, PEER);
    // Acquired in place: GPU 2's slab waits for the release.
    engine.acquire(&[tail], Access::ReadOnly, S).unwrap();
    assert_eq!(device_bytes(&engine, sim.as_ref(), tail), data[..2 * PEER * CHUNK]);
    assert_eq!(engine.set_peer_lending(2, 0).unwrap(), 0, "held in place");
    engine.release(&[tail], S).unwrap();
    assert_eq!(engine.set_peer_lending(2, 0).unwrap(), PEER * CHUNK);
    assert_eq!(support::buffer_stats(&engine, buffer).in_peer, 0);
    assert_contents(&engine, buffer, &data);
    support::assert_no_leaks(engine, Some(sim));
}

#[test]
fn a_buffer_read_in_place_is_freed_and_without_neighbours_in_place_is_a_plain_read() {
    let (engine, sim) = support::engine_with_peers(HBM, HOST, PEER, in_place());
    let (buffer, data) = spread(&engine, AllocOptions::default(), 13);
    let whole = Region::bytes(buffer, 0, data.len());
    engine.acquire(&[whole], Access::InPlaceOk, S).unwrap();
    assert!(matches!(engine.free(buffer), Err(Error::Acquired { .. })));
    engine.release(&[whole], S).unwrap();
    engine.free(buffer).unwrap();
    let borrowed: usize = engine.peer_lenders().iter().map(|l| l.2).sum();
    assert!(borrowed > 0, "slabs stay lent for the next buffer");
    support::assert_no_leaks(engine, Some(sim));

    let (engine, sim) = support::engine(HBM, HOST, support::config());
    let (buffer, _) = engine.alloc(3 * CHUNK, AllocOptions::default()).unwrap();
    let data = fill(&engine, buffer, 3 * CHUNK, 17);
    let region = Region::bytes(buffer, 0, 3 * CHUNK);
    engine.acquire(&[region], Access::InPlaceOk, S).unwrap();
    assert_eq!(support::buffer_stats(&engine, buffer).in_hbm, 3);
    engine.release(&[region], S).unwrap();
    assert_contents(&engine, buffer, &data);
    support::assert_no_leaks(engine, sim);
}

#[test]
fn without_slabs_made_for_it_nothing_is_read_in_place() {
    let (engine, sim) = support::engine_with_peers(HBM, HOST, PEER, support::config());
    let (buffer, data) = spread(&engine, AllocOptions::default(), 19);
    let head = Region::bytes(buffer, 0, HBM * CHUNK);
    engine.acquire(&[head], Access::InPlaceOk, S).unwrap();
    let stats = support::buffer_stats(&engine, buffer);
    assert_eq!((stats.in_place, stats.in_hbm), (0, HBM), "a plain read");
    engine.release(&[head], S).unwrap();
    assert_contents(&engine, buffer, &data);
    support::assert_no_leaks(engine, Some(sim));
}
