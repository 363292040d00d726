//! Driver calls failing in the middle of a move (failpoints of the simulated device, named
//! after the CUDA calls). For each: the engine call returns an error naming both itself and
//! the CUDA call; once the failpoint is removed every byte written before reads back
//! unchanged, the operation succeeds when retried, and dropping the engine gives the device
//! everything back.
//!
//! Failpoints are process-global: every test here holds the lock of `support::failpoints`.
//! Background file reads and writes under failpoints are in file_failpoints.rs.
//! Run with `cargo test -p tiermem --features failpoints`.
#![cfg(feature = "failpoints")]

mod support;

use std::sync::Arc;
use support::failpoints::scenario;
use support::{acquired_chunks, assert_contents, assert_hbm_accounted, buffer_stats, fill, CHUNK};
use tiermem::mechanism::sim::SimDevice;
use tiermem::mechanism::DeviceError;
use tiermem::Tier;
use tiermem::{Access, AllocOptions, BufferId, Engine, EngineConfig, Error, Region, StreamHandle, Target};

const S: StreamHandle = StreamHandle(0);

/// An engine over the simulated device (whatever `TIERMEM_TEST_BACKEND` says: failpoints are
/// in the simulated device): `hbm` chunks of HBM, 16 of host tier, `batch` chunks a batch.
fn world(hbm: usize, batch: usize) -> (Engine, Arc<SimDevice>) {
    support::sim_engine(hbm + 4, hbm, 16, EngineConfig { batch_chunks: batch, ..support::config() })
}

/// Asserts `result` is the engine call `call` failing in the CUDA call `cuda`.
#[track_caller]
fn assert_device_error<T: std::fmt::Debug>(result: Result<T, Error>, call: &str, cuda: &str) {
    let err = result.expect_err("the failpoint should make the call fail");
    match &err {
        Error::Device {
            call: c,
            source: DeviceError::Driver { call: d, .. } | DeviceError::OutOfMemory { call: d, .. },
        } => {
            assert_eq!((*c, *d), (call, cuda), "{err}");
        }
        other => panic!("expected {call} failing in {cuda}, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.starts_with(&format!("{call}: {cuda}")), "the message should name {call} and {cuda}: {msg}");
}

/// Buffers and the bytes they must hold.
type Contents = Vec<(BufferId, Vec<u8>)>;

fn check(engine: &Engine, contents: &Contents) {
    assert_eq!(acquired_chunks(engine), 0, "an error left chunks acquired");
    for (id, bytes) in contents {
        assert_contents(engine, *id, bytes);
    }
}

fn done(engine: Engine, sim: Arc<SimDevice>) {
    support::assert_no_leaks(engine, Some(sim));
}

/// A buffer of `chunks` chunks with known bytes, paged out to the host tier.
fn on_host(engine: &Engine, chunks: usize, seed: u64) -> (BufferId, Vec<u8>) {
    let size = chunks * CHUNK - 123;
    let (id, _) = engine.alloc(size, AllocOptions::default()).unwrap();
    let bytes = fill(engine, id, size, seed);
    engine.page_out(Target::Buffer(id)).unwrap();
    assert_eq!(buffer_stats(engine, id).in_host, chunks);
    (id, bytes)
}

/// Page-in of a 4-chunk buffer from the host with `cuda` failing per `actions`; returns how many
/// chunks made it before the failure. Another buffer holds the physical chunks that `a`'s stale
/// mappings point at, so the page-in must map afresh.
fn page_in_failing(cuda: &str, actions: &str, batch: usize, call: &str) -> usize {
    let (_g, scenario) = scenario();
    let (engine, sim) = world(8, batch);
    let (a, a_bytes) = on_host(&engine, 4, 1);
    let (other, _) = engine.alloc(4 * CHUNK, AllocOptions::default()).unwrap();
    fill(&engine, other, 4 * CHUNK, 2);
    fail::cfg(cuda, actions).unwrap();
    let result = match call {
        "page_in" => engine.page_in(Target::Buffer(a)),
        "acquire" => engine.acquire(&[Region::whole(a)], Access::ReadWrite, S),
        "read" => engine.read(a, 0, &mut vec![0u8; 2 * CHUNK]),
        other => unreachable!("{other}"),
    };
    assert_device_error(result, call, cuda);
    let s = buffer_stats(&engine, a);
    assert_eq!(s.acquired, 0, "{cuda} {actions}: chunks left acquired");
    assert_eq!(s.in_hbm + s.in_host, 4, "{cuda} {actions}: {}", engine.stats());
    assert_hbm_accounted(&engine);
    let landed = s.in_hbm;
    fail::remove(cuda);
    let contents = vec![(a, a_bytes)];
    engine.page_in(Target::Buffer(a)).expect("page_in once the failpoint is gone");
    assert_eq!(buffer_stats(&engine, a).in_hbm, 4);
    engine.acquire(&[Region::whole(a)], Access::ReadWrite, S).expect("acquire once the failpoint is gone");
    engine.release(&[Region::whole(a)], S).unwrap();
    check(&engine, &contents);
    done(engine, sim);
    scenario.teardown();
    landed
}

#[test]
fn cu_mem_map_failing_rolls_back_the_batch() {
    // One map per chunk, batches of 2: failing the 1st..4th map fails batch 1 or batch 2,
    // at its first or its second chunk. Chunks of batches that landed stay resident.
    for (actions, landed) in [("return", 0), ("1*off->return", 0), ("2*off->return", 2), ("3*off->return", 2)] {
        assert_eq!(page_in_failing("cuMemMap", actions, 2, "page_in"), landed, "{actions}");
    }
    assert_eq!(page_in_failing("cuMemMap", "return", 16, "acquire"), 0);
    assert_eq!(page_in_failing("cuMemMap", "1*off->return", 16, "read"), 0);
}

#[test]
fn cu_mem_set_access_failing_rolls_back_the_batch() {
    // One cuMemSetAccess per batch.
    for (actions, landed) in [("return", 0), ("1*off->return", 2)] {
        assert_eq!(page_in_failing("cuMemSetAccess", actions, 2, "page_in"), landed, "{actions}");
    }
    assert_eq!(page_in_failing("cuMemSetAccess", "return", 16, "acquire"), 0);
}

#[test]
fn cu_memcpy_htod_failing_rolls_back_the_batch() {
    // The paged-out chunks sit in adjacent host slots: one copy per batch.
    for (actions, landed) in [("return", 0), ("1*off->return", 2)] {
        assert_eq!(page_in_failing("cuMemcpyHtoDAsync", actions, 2, "page_in"), landed, "{actions}");
    }
    assert_eq!(page_in_failing("cuMemcpyHtoDAsync", "1*off->return", 1, "acquire"), 1);
    assert_eq!(page_in_failing("cuMemcpyHtoDAsync", "return", 16, "read"), 0);
}

#[test]
fn cu_mem_map_failing_on_a_never_written_buffer_leaves_it_empty() {
    let (_g, scenario) = scenario();
    let (engine, sim) = world(4, 2);
    let (a, _) = engine.alloc(3 * CHUNK, AllocOptions::default()).unwrap();
    fail::cfg("cuMemMap", "2*off->return").unwrap();
    assert_device_error(engine.acquire(&[Region::whole(a)], Access::ReadWrite, S), "acquire", "cuMemMap");
    assert_hbm_accounted(&engine);
    assert_eq!(buffer_stats(&engine, a).acquired, 0);
    fail::remove("cuMemMap");
    check(&engine, &vec![(a, vec![0u8; 3 * CHUNK])]);
    done(engine, sim);
    scenario.teardown();
}

/// A page-in whose `cuMemSetAccess` fails, and then the `cuMemUnmap` of its rollback too,
/// used to leave a mapping that no chunk recorded: freeing the buffer then failed for ever
/// (`cuMemAddressFree`: still mapped). The rollback now keeps the new mappings as stale ones.
#[test]
fn a_failed_page_in_whose_unmap_fails_too_still_frees() {
    let (_g, scenario) = scenario();
    let (engine, sim) = world(4, 2);
    let (a, _) = engine.alloc(2 * CHUNK, AllocOptions::default()).unwrap(); // never mapped
    fail::cfg("cuMemSetAccess", "return").unwrap();
    fail::cfg("cuMemUnmap", "return").unwrap();
    assert_device_error(engine.acquire(&[Region::whole(a)], Access::ReadWrite, S), "acquire", "cuMemSetAccess");
    fail::remove("cuMemSetAccess");
    fail::remove("cuMemUnmap");
    assert_hbm_accounted(&engine);
    check(&engine, &vec![(a, vec![0u8; 2 * CHUNK])]);
    let bytes = fill(&engine, a, 2 * CHUNK, 9); // maps it again: with access this time
    check(&engine, &vec![(a, bytes)]);
    engine.free(a).expect("free after a failed page-in");
    done(engine, sim);
    scenario.teardown();
}

#[test]
fn cu_memcpy_dtoh_failing_during_page_out_keeps_the_data_in_hbm() {
    for (actions, moved) in [("return", 0), ("1*off->return", 2)] {
        let (_g, scenario) = scenario();
        let (engine, sim) = world(4, 2);
        let size = 4 * CHUNK - 5;
        let (a, _) = engine.alloc(size, AllocOptions::default()).unwrap();
        let contents = vec![(a, fill(&engine, a, size, 3))];
        fail::cfg("cuMemcpyDtoHAsync", actions).unwrap();
        assert_device_error(engine.page_out(Target::Buffer(a)), "page_out", "cuMemcpyDtoHAsync");
        let stats = engine.stats();
        let s = buffer_stats(&engine, a);
        assert_eq!(s.in_hbm, 4 - moved, "{actions}: the chunks of the failed batch must stay in HBM: {stats}");
        assert_eq!(s.moving + s.in_host, moved, "{actions}: {stats}");
        assert_eq!(
            stats.tiers[Tier::Host].chunks,
            moved,
            "{actions}: host slots of the failed batch not returned: {stats}"
        );
        fail::remove("cuMemcpyDtoHAsync");
        check(&engine, &contents);
        engine.page_out(Target::Buffer(a)).expect("page_out once the failpoint is gone");
        assert_eq!(buffer_stats(&engine, a).in_host, 4);
        check(&engine, &contents);
        done(engine, sim);
        scenario.teardown();
    }
}

#[test]
fn cu_memcpy_dtoh_failing_during_eviction_fails_the_demand_and_keeps_the_victims() {
    let (_g, scenario) = scenario();
    let (engine, sim) = world(4, 2);
    let (a, _) = engine.alloc(4 * CHUNK, AllocOptions::default()).unwrap();
    let (b, _) = engine.alloc(2 * CHUNK, AllocOptions::default()).unwrap();
    let mut contents = vec![(a, fill(&engine, a, 4 * CHUNK, 4))];
    fail::cfg("cuMemcpyDtoHAsync", "return").unwrap();
    assert_device_error(engine.acquire(&[Region::whole(b)], Access::ReadWrite, S), "acquire", "cuMemcpyDtoHAsync");
    assert_device_error(engine.write(b, 0, &[1, 2, 3]), "write", "cuMemcpyDtoHAsync");
    assert_device_error(engine.page_in(Target::Buffer(b)), "page_in", "cuMemcpyDtoHAsync");
    assert_eq!(buffer_stats(&engine, a).in_hbm, 4, "victims must stay in HBM when their copy fails");
    assert_eq!(buffer_stats(&engine, b).in_hbm, 0);
    assert_eq!(engine.stats().tiers[Tier::Host].chunks, 0, "host slots of the failed copies not returned");
    assert_hbm_accounted(&engine);
    fail::remove("cuMemcpyDtoHAsync");
    check(&engine, &contents);
    engine.acquire(&[Region::whole(b)], Access::ReadWrite, S).expect("acquire once the failpoint is gone");
    engine.release(&[Region::whole(b)], S).unwrap();
    contents.push((b, vec![0u8; 2 * CHUNK]));
    check(&engine, &contents);
    done(engine, sim);
    scenario.teardown();
}

#[test]
fn cu_mem_address_reserve_failing_allocates_nothing() {
    let (_g, scenario) = scenario();
    let (engine, sim) = world(4, 2);
    let (a, _) = engine.alloc(CHUNK, AllocOptions::default()).unwrap();
    let contents = vec![(a, fill(&engine, a, CHUNK, 5))];
    let before = sim.live();
    fail::cfg("cuMemAddressReserve", "return").unwrap();
    assert_device_error(engine.alloc(3 * CHUNK, AllocOptions::default()), "alloc", "cuMemAddressReserve");
    assert_eq!(sim.live(), before, "a failed alloc took something from the device");
    assert_eq!(engine.stats().buffers.len(), 1);
    fail::remove("cuMemAddressReserve");
    let (b, _) = engine.alloc(3 * CHUNK, AllocOptions::default()).expect("alloc once the failpoint is gone");
    assert_eq!(sim.live().reservations, 2);
    check(&engine, &contents);
    engine.free(b).unwrap();
    done(engine, sim);
    scenario.teardown();
}

#[test]
fn cu_mem_host_alloc_failing_keeps_the_data_in_hbm() {
    let (_g, scenario) = scenario();
    let (engine, sim) = world(2, 2);
    let (a, _) = engine.alloc(2 * CHUNK, AllocOptions::default()).unwrap();
    let (b, _) = engine.alloc(CHUNK, AllocOptions::default()).unwrap();
    let mut contents = vec![(a, fill(&engine, a, 2 * CHUNK, 6))];
    fail::cfg("cuMemHostAlloc", "return").unwrap();
    assert_device_error(engine.page_out(Target::Buffer(a)), "page_out", "cuMemHostAlloc");
    assert_eq!(buffer_stats(&engine, a).in_hbm, 2);
    // Eviction needs the host tier too.
    assert_device_error(engine.acquire(&[Region::whole(b)], Access::ReadWrite, S), "acquire", "cuMemHostAlloc");
    assert_eq!(buffer_stats(&engine, a).in_hbm, 2);
    assert_eq!(sim.live().pinned_bytes, 0);
    assert_eq!(engine.stats().host_pinned_bytes, 0);
    fail::remove("cuMemHostAlloc");
    check(&engine, &contents);
    engine.page_out(Target::Buffer(a)).expect("page_out once the failpoint is gone");
    assert_eq!(buffer_stats(&engine, a).in_host, 2);
    contents.push((b, fill(&engine, b, CHUNK, 7)));
    check(&engine, &contents);
    done(engine, sim);
    scenario.teardown();
}

#[test]
fn cu_mem_create_failing_falls_back_to_eviction() {
    let (_g, scenario) = scenario();
    let (engine, sim) = world(4, 2);
    let (a, _) = engine.alloc(2 * CHUNK, AllocOptions::default()).unwrap();
    let (b, _) = engine.alloc(2 * CHUNK, AllocOptions::default()).unwrap();
    let mut contents = vec![(a, fill(&engine, a, 2 * CHUNK, 8))];
    fail::cfg("cuMemCreate", "return").unwrap();
    // HBM has room under the cap, but the device will not create more chunks: evict a's.
    contents.push((b, fill(&engine, b, 2 * CHUNK, 9)));
    assert_eq!(engine.stats().tiers[Tier::Hbm].chunks, 2);
    assert_eq!(buffer_stats(&engine, b).in_hbm, 2);
    check(&engine, &contents);
    fail::remove("cuMemCreate");
    check(&engine, &contents);
    done(engine, sim);
    scenario.teardown();
}

#[test]
fn cu_mem_create_failing_with_nothing_evictable_is_an_error_that_changes_nothing() {
    let (_g, scenario) = scenario();
    let (engine, sim) = world(4, 2);
    let (a, _) = engine.alloc(2 * CHUNK, AllocOptions::default()).unwrap();
    let (b, _) = engine.alloc(2 * CHUNK, AllocOptions::default()).unwrap();
    let mut contents = vec![(a, fill(&engine, a, 2 * CHUNK, 10))];
    engine.acquire(&[Region::whole(a)], Access::ReadOnly, S).unwrap();
    fail::cfg("cuMemCreate", "return").unwrap();
    let err = engine.acquire(&[Region::whole(b)], Access::ReadWrite, S).unwrap_err();
    assert!(
        matches!(&err, Error::Device { call: "acquire", .. } | Error::OutOfMemory { call: "acquire", .. }),
        "{err:?}"
    );
    assert!(err.to_string().starts_with("acquire:"), "{err}");
    assert_eq!((buffer_stats(&engine, a).acquired, buffer_stats(&engine, b).acquired), (2, 0));
    assert_hbm_accounted(&engine);
    engine.release(&[Region::whole(a)], S).unwrap();
    fail::remove("cuMemCreate");
    contents.push((b, fill(&engine, b, 2 * CHUNK, 11)));
    check(&engine, &contents);
    done(engine, sim);
    scenario.teardown();
}

#[test]
fn evictions_make_no_driver_call_and_unmap_failing_in_free_loses_nothing() {
    let (_g, scenario) = scenario();
    let (engine, sim) = world(4, 2);
    let (a, _) = engine.alloc(CHUNK, AllocOptions::default()).unwrap();
    let (b, _) = engine.alloc(CHUNK, AllocOptions::default()).unwrap();
    let contents = vec![(a, fill(&engine, a, CHUNK, 12)), (b, fill(&engine, b, CHUNK, 13))];
    engine.page_out(Target::All).unwrap();
    engine.page_in(Target::Buffer(a)).unwrap();
    engine.page_in(Target::Buffer(b)).unwrap(); // both clean: a page-out only detaches them
    fail::cfg("cuMemUnmap", "return").unwrap();
    engine.page_out(Target::All).expect("a clean page-out leaves stale mappings: no cuMemUnmap");
    // `free` must unmap the stale mapping: it fails, and the buffer stays whole.
    assert_device_error(engine.free(a), "free", "cuMemUnmap");
    check(&engine, &contents);
    fail::remove("cuMemUnmap");
    engine.free(a).expect("free once the failpoint is gone");
    check(&engine, &contents[1..].to_vec());
    done(engine, sim);
    scenario.teardown();
}

#[test]
fn cu_mem_unmap_failing_in_free_keeps_the_buffer() {
    let (_g, scenario) = scenario();
    let (engine, sim) = world(4, 2);
    let (a, _) = engine.alloc(2 * CHUNK, AllocOptions::default()).unwrap();
    let (b, _) = engine.alloc(2 * CHUNK, AllocOptions::default()).unwrap();
    let a_bytes = fill(&engine, a, 2 * CHUNK, 14);
    let contents = vec![(b, fill(&engine, b, 2 * CHUNK, 15))];
    fail::cfg("cuMemUnmap", "return").unwrap();
    assert_device_error(engine.free(a), "free", "cuMemUnmap");
    fail::remove("cuMemUnmap");
    // The failed free changed nothing: a is still there, with its bytes, and can be freed.
    assert_contents(&engine, a, &a_bytes);
    engine.free(a).expect("free once the failpoint is gone");
    check(&engine, &contents);
    done(engine, sim);
    scenario.teardown();
}
