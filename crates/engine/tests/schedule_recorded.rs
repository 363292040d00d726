//! A schedule recorded from the program's first pass (`pass_begins`, `step_enters`) pages as a
//! schedule set by hand does (schedule.rs), and every byte survives. Runs on the GPU too.

mod support;

use support::{assert_contents, fill, CHUNK};
use tiermem::{Access, AllocOptions, BufferId, Engine, Error, Region, StreamHandle, Target};

const S: StreamHandle = StreamHandle(0);
const LAYERS: usize = 10;
const CAP: usize = 4;
/// The key of layer `i` is `KEY + i`: any numbers do, the same every pass.
const KEY: u64 = 1000;

/// `LAYERS` read-only one-chunk layers with known contents, all paged out.
fn layers(engine: &Engine) -> Vec<(BufferId, Vec<u8>)> {
    let options = AllocOptions { read_only: true, ..AllocOptions::default() };
    let layers: Vec<(BufferId, Vec<u8>)> = (0..LAYERS)
        .map(|i| {
            let (id, _) = engine.alloc(CHUNK, options.clone()).unwrap();
            (id, fill(engine, id, CHUNK, 20 + i as u64))
        })
        .collect();
    engine.page_out(Target::All).unwrap();
    layers
}

/// One pass over `order` (indices into `layers`), each step entered before it is acquired;
/// returns the pass's page-ins and the steps located.
fn pass(engine: &Engine, layers: &[(BufferId, Vec<u8>)], order: &[usize]) -> (u64, Vec<Option<usize>>) {
    let before = engine.stats().transfers.page_ins;
    engine.pass_begins().unwrap();
    let located = order
        .iter()
        .map(|&i| {
            let id = layers[i].0;
            let step = engine.step_enters(KEY + i as u64, &[id, id], 0).unwrap();
            let region = [Region::whole(id)];
            engine.acquire(&region, Access::ReadOnly, S).unwrap();
            engine.release(&region, S).unwrap();
            step
        })
        .collect();
    (engine.stats().transfers.page_ins - before, located)
}

#[test]
fn a_recorded_schedule_streams_only_the_excess_as_a_set_one_does() {
    let (engine, sim) = support::engine(CAP, 64, support::config());
    let layers = layers(&engine);
    let order: Vec<usize> = (0..LAYERS).collect();
    // The first pass is recorded: nothing is located and LRU streams every layer.
    assert_eq!(pass(&engine, &layers, &order), (LAYERS as u64, vec![None; LAYERS]));
    assert!(engine.recorded_steps().is_empty(), "the schedule is known only when the next pass begins");
    let mut last = 0;
    for _ in 0..3 {
        let (page_ins, located) = pass(&engine, &layers, &order);
        assert_eq!(located, order.iter().map(|&i| Some(i)).collect::<Vec<_>>());
        last = page_ins;
    }
    assert_eq!(engine.recorded_steps(), order.iter().map(|&i| KEY + i as u64).collect::<Vec<_>>());
    // Belady keeps CAP - 1 layers resident for good; the last slot streams the rest.
    assert_eq!(last, (LAYERS - CAP + 1) as u64);
    for (id, bytes) in &layers {
        assert_contents(&engine, *id, bytes);
    }
    support::assert_no_leaks(engine, sim);
}

#[test]
fn a_forgotten_schedule_is_recorded_again_and_a_freed_buffer_leaves_the_recording() {
    let (engine, sim) = support::engine(CAP, 64, support::config());
    let layers = layers(&engine);
    let forward: Vec<usize> = (0..LAYERS).collect();
    pass(&engine, &layers, &forward);
    engine.pass_begins().unwrap();
    assert_eq!(engine.recorded_steps().len(), LAYERS);

    // clear_schedule forgets the recording too: the next pass records afresh.
    engine.clear_schedule();
    assert!(engine.recorded_steps().is_empty());
    assert!(matches!(engine.advance(0, 0), Err(Error::Schedule { call: "advance", .. })));
    let backward: Vec<usize> = (0..LAYERS).rev().collect();
    assert_eq!(pass(&engine, &layers, &backward).1, vec![None; LAYERS]);

    // A buffer of the recording freed before it becomes the schedule leaves it, as it leaves
    // a schedule already set: the pass is not refused, and its steps are located as recorded
    // (step 3's key, its buffer gone, is still a step).
    engine.free(layers[3].0).unwrap();
    engine.pass_begins().unwrap();
    assert_eq!(engine.recorded_steps().len(), LAYERS);
    let live: Vec<usize> = backward.iter().copied().filter(|&i| i != 3).collect();
    let (_, located) = pass(&engine, &layers, &live);
    let expected: Vec<Option<usize>> = (0..LAYERS).filter(|&s| s != LAYERS - 1 - 3).map(Some).collect();
    assert_eq!(located, expected);
    assert!(engine.advance(0, CHUNK).is_ok(), "the schedule is set");

    // A schedule set by hand replaces the recorded one.
    engine.set_schedule(vec![vec![layers[0].0]]).unwrap();
    assert!(engine.recorded_steps().is_empty());
    assert_eq!(engine.step_enters(KEY, &[layers[0].0], 0).unwrap(), None);
    for (id, bytes) in layers.iter().filter(|(id, _)| *id != layers[3].0) {
        assert_contents(&engine, *id, bytes);
    }
    support::assert_no_leaks(engine, sim);
}

/// Two programs in one engine (two models offloaded into one pool) alternate passes, each
/// with steps of its own: each has its own recorded schedule, the one whose pass runs is in
/// use, so both page ahead along their own order (recorder.rs, "Several programs").
#[test]
fn two_programs_taking_turns_each_page_ahead_along_their_own_schedule() {
    let (engine, sim) = support::engine(CAP, 64, support::config());
    let all = layers(&engine);
    let (a, b) = all.split_at(LAYERS / 2);
    let run = |layers: &[(BufferId, Vec<u8>)], key: u64| {
        let prefetched = engine.stats().transfers.prefetched;
        engine.pass_begins().unwrap();
        let located: Vec<Option<usize>> = layers
            .iter()
            .enumerate()
            .map(|(i, &(id, _))| {
                let step = engine.step_enters(key + i as u64, &[id], CHUNK).unwrap();
                let region = [Region::whole(id)];
                engine.acquire(&region, Access::ReadOnly, S).unwrap();
                engine.release(&region, S).unwrap();
                step
            })
            .collect();
        (located, engine.stats().transfers.prefetched - prefetched)
    };
    let every = |n: usize| (0..n).map(Some).collect::<Vec<_>>();
    assert_eq!(run(a, KEY).0, vec![None; a.len()], "A's first pass is recorded");
    assert_eq!(run(b, 2 * KEY).0, vec![None; b.len()], "so is B's, beside A's schedule");
    // What one pass pages ahead depends on the GPU's timing (on the H200, in one of
    // nine runs one pass paged nothing ahead): each program pages ahead over its passes.
    let (mut prefetched, mut passes) = ([0; 2], Vec::new());
    for _ in 0..3 {
        for (program, (layers, key)) in [(a, KEY), (b, 2 * KEY)].into_iter().enumerate() {
            let (located, paged_ahead) = run(layers, key);
            assert_eq!(located, every(layers.len()), "every step of the pass is located in its own schedule");
            prefetched[program] += paged_ahead;
            passes.push(paged_ahead);
        }
    }
    assert!(prefetched.iter().all(|&n| n > 0), "each program pages ahead along its schedule: {passes:?}");
    let keys = engine.recorded_steps();
    assert_eq!(keys.len(), LAYERS, "both schedules: {keys:?}");
    for (id, bytes) in &all {
        assert_contents(&engine, *id, bytes);
    }
    support::assert_no_leaks(engine, sim);
}

/// Activations: each forward step writes a buffer of its own that its backward step reads and
/// then discards (`step_also_uses` puts them in the recording, as `tiermem.torch` does). Once
/// recorded, the schedule brings each one in ahead of its backward step, and the forward's
/// writes never page the dead bytes in: each pass zero-fills every activation at most once (a
/// discarded chunk still leaving HBM behind work on it, when it is wanted again, stays with its
/// dead bytes instead: `Engine::discard` leaves them undefined until written).
#[test]
fn buffers_made_during_steps_are_paged_ahead_and_discarded_ones_never_come_back() {
    let (engine, sim) = support::engine(CAP, 64, support::config());
    let layers = layers(&engine);
    let activations: Vec<BufferId> =
        (0..LAYERS).map(|_| engine.alloc(CHUNK, AllocOptions::default()).unwrap().0).collect();
    let window = 2 * CHUNK;
    let mut ahead = 0;
    for round in 0..4u64 {
        let before = engine.stats().transfers;
        engine.pass_begins().unwrap();
        for (i, (layer, _)) in layers.iter().enumerate() {
            engine.step_enters(KEY + i as u64, &[*layer], window).unwrap();
            engine.acquire(&[Region::whole(*layer)], Access::ReadOnly, S).unwrap();
            engine.release(&[Region::whole(*layer)], S).unwrap();
            let page_ins = engine.stats().transfers.page_ins;
            engine.write(activations[i], 0, &support::pattern(round * 100 + i as u64, CHUNK)).unwrap();
            assert_eq!(engine.stats().transfers.page_ins, page_ins, "a write never pages the dead bytes in");
            assert_eq!(engine.step_also_uses(&[activations[i]]), round == 0, "recorded in the first pass only");
        }
        for (i, (layer, _)) in layers.iter().enumerate().rev() {
            engine.step_enters(2 * KEY + i as u64, &[*layer], window).unwrap();
            engine.step_also_uses(&[activations[i]]);
            let stats = support::buffer_stats(&engine, activations[i]);
            ahead += usize::from(round > 0 && stats.in_hbm + stats.moving == 1);
            assert_contents(&engine, activations[i], &support::pattern(round * 100 + i as u64, CHUNK));
            assert_eq!(engine.discard(&[Region::whole(activations[i])]).unwrap(), 1);
        }
        let after = engine.stats().transfers;
        let zero_fills = after.zero_fills - before.zero_fills;
        assert!(zero_fills <= LAYERS as u64 && (round > 0 || zero_fills == LAYERS as u64), "zero fills: {zero_fills}");
        assert_eq!(after.discarded - before.discarded, LAYERS as u64);
    }
    assert_eq!(ahead, 3 * LAYERS, "the schedule brought activations in ahead of backward: {ahead}");
    for (id, bytes) in &layers {
        assert_contents(&engine, *id, bytes);
    }
    support::assert_no_leaks(engine, sim);
}
