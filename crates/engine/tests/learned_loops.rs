//! Loops learned from acquires (`TIERMEM_LEARN_LOOPS`, recorder.rs): a program that acquires
//! its buffers in the same order pass after pass, naming nothing (after a one-off acquire or
//! not), pages like one that set its
//! schedule (Belady keeps what fits, a pass streams about what exceeds HBM, where LRU streams
//! everything); one that acquires in no fixed order gets its policy back; one that names its
//! passes is not second-guessed; every byte survives. Runs on the GPU too.

mod support;

use support::{assert_contents, fill, CHUNK};
use tiermem::{Access, AllocOptions, BufferId, Engine, EngineConfig, Region, StreamHandle, Target};

const S: StreamHandle = StreamHandle(0);
const BUFFERS: usize = 12;
const CAP: usize = 6;

fn engine(learn: bool) -> (Engine, Sim) {
    let config = EngineConfig { learn_loops: learn.then_some(0), stride_prefetch: 0, ..support::config() };
    support::engine(CAP, 2 * BUFFERS, config)
}

/// `BUFFERS` one-chunk buffers with known contents, all paged out.
fn buffers(engine: &Engine) -> Vec<(BufferId, Vec<u8>)> {
    let buffers: Vec<(BufferId, Vec<u8>)> = (0..BUFFERS)
        .map(|i| {
            let (id, _) = engine.alloc(CHUNK, AllocOptions::default()).unwrap();
            (id, fill(engine, id, CHUNK, 40 + i as u64))
        })
        .collect();
    engine.page_out(Target::All).unwrap();
    buffers
}

/// Acquires and releases the buffers in `order`; returns the page-ins it took.
fn pass(engine: &Engine, buffers: &[(BufferId, Vec<u8>)], order: &[usize]) -> u64 {
    let before = engine.stats().transfers.page_ins;
    for &i in order {
        let region = [Region::whole(buffers[i].0)];
        engine.acquire(&region, Access::ReadOnly, S).unwrap();
        engine.release(&region, S).unwrap();
    }
    engine.stats().transfers.page_ins - before
}

type Sim = Option<std::sync::Arc<tiermem::mechanism::sim::SimDevice>>;
type Buffers = Vec<(BufferId, Vec<u8>)>;

/// An engine that learned the loop over [`buffers`] in order from two passes, and the order.
fn learned() -> (Engine, Sim, Buffers, Vec<usize>) {
    let (engine, sim) = engine(true);
    let buffers = buffers(&engine);
    let in_order: Vec<usize> = (0..BUFFERS).collect();
    pass(&engine, &buffers, &in_order);
    pass(&engine, &buffers, &in_order);
    assert_eq!(engine.recorded_steps().len(), BUFFERS);
    (engine, sim, buffers, in_order)
}

#[test]
fn a_loop_learned_from_acquires_streams_only_what_exceeds_hbm() {
    let in_order: Vec<usize> = (0..BUFFERS).collect();
    let (lru, lru_sim) = engine(false);
    let lru_buffers = buffers(&lru);
    let lru_moved: Vec<u64> = (0..4).map(|_| pass(&lru, &lru_buffers, &in_order)).collect();
    assert_eq!(lru_moved[3], BUFFERS as u64, "LRU over a loop larger than HBM streams everything");

    let (learned, sim) = engine(true);
    let buffers = buffers(&learned);
    // A one-off acquire first (setting up): the loop is learned all the same.
    let (setup, _) = learned.alloc(CHUNK, AllocOptions::default()).unwrap();
    pass(&learned, &[(setup, Vec::new())], &[0]);
    let moved: Vec<u64> = (0..4).map(|_| pass(&learned, &buffers, &in_order)).collect();
    assert_eq!(learned.recorded_steps().len(), BUFFERS, "one step per acquire");
    // Belady on the learned order: what fits stays, about (used - HBM) streams.
    assert!(moved[3] <= (BUFFERS - CAP + 1) as u64, "a learned pass moved {} chunks: {moved:?}", moved[3]);
    for (id, data) in &buffers {
        assert_contents(&learned, *id, data);
    }
    learned.free(setup).unwrap();
    support::assert_no_leaks(learned, sim);
    support::assert_no_leaks(lru, lru_sim);
}

#[test]
fn acquires_refused_and_tried_again_do_not_end_the_learning() {
    // A tenant whose budget shrank: its acquires fail until room is made, and it retries
    // (tiermemd's tenants do). The refused tries are not steps: the loop stays learned.
    let (engine, sim, buffers, in_order) = learned();
    // Half a pass, then another holds all of HBM while the next acquire is tried again and again.
    pass(&engine, &buffers, &in_order[..BUFFERS / 2]);
    let (all_of_hbm, _) = engine.alloc(CAP * CHUNK, AllocOptions::default()).unwrap();
    let hog = [Region::whole(all_of_hbm)];
    engine.acquire(&hog, Access::ReadWrite, S).unwrap();
    let next = [Region::whole(buffers[BUFFERS / 2].0)];
    for _ in 0..3 * BUFFERS {
        let refused = engine.acquire(&next, Access::ReadOnly, S).unwrap_err();
        assert!(matches!(refused, tiermem::Error::OutOfMemory { .. }), "{refused}");
    }
    engine.release(&hog, S).unwrap();
    engine.free(all_of_hbm).unwrap();
    pass(&engine, &buffers, &in_order[BUFFERS / 2..]);
    let moved: Vec<u64> = (0..3).map(|_| pass(&engine, &buffers, &in_order)).collect();
    assert_eq!(engine.recorded_steps().len(), BUFFERS, "still learned");
    // Belady's pass after the hog emptied HBM: a chunk more than from a warm start, far from
    // LRU's every chunk.
    assert!(moved[2] <= (BUFFERS - CAP + 2) as u64, "a learned pass moved {} chunks: {moved:?}", moved[2]);
    for (id, data) in &buffers {
        assert_contents(&engine, *id, data);
    }
    support::assert_no_leaks(engine, sim);
}

#[test]
fn acquires_in_no_fixed_order_give_the_policy_back_and_lose_nothing() {
    let (engine, sim, buffers, _) = learned();
    // Then the program changes its ways: a scrambled order each pass, starting where it used to.
    for round in 1..4u64 {
        let mut order: Vec<usize> = (1..BUFFERS).collect();
        order.sort_by_key(|&i| (i as u64 * 7 + round * 5) % BUFFERS as u64);
        order.insert(0, 0);
        pass(&engine, &buffers, &order);
    }
    assert!(engine.recorded_steps().is_empty(), "a schedule that did not predict was kept");
    for (id, data) in &buffers {
        assert_contents(&engine, *id, data);
    }
    support::assert_no_leaks(engine, sim);
}

#[test]
fn a_program_that_names_its_passes_is_not_second_guessed() {
    let (engine, sim) = engine(true);
    let buffers = buffers(&engine);
    engine.pass_begins().unwrap();
    pass(&engine, &buffers, &[0, 1, 2]);
    engine.pass_begins().unwrap();
    assert!(engine.recorded_steps().is_empty(), "no step named: nothing recorded, nothing learned");
    pass(&engine, &buffers, &[0, 1, 2]);
    pass(&engine, &buffers, &[0, 1, 2]);
    assert!(engine.recorded_steps().is_empty());
    support::assert_no_leaks(engine, sim);
}
