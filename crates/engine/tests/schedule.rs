//! Known schedules: Belady eviction streams only what does not fit, paging ahead overlaps
//! the copies with the steps, and every byte survives. Runs on the GPU too.

mod support;

use support::{assert_contents, fill, CHUNK};
use tiermem::{Access, AllocOptions, BufferId, Engine, EngineConfig, Error, Region, StreamHandle, Target};

const S: StreamHandle = StreamHandle(0);
const LAYERS: usize = 10;
const CAP: usize = 4;

/// `LAYERS` read-only one-chunk "layers" with known contents, all paged out.
fn layers(engine: &Engine) -> Vec<(BufferId, Vec<u8>)> {
    let options = AllocOptions { read_only: true, ..AllocOptions::default() };
    let layers: Vec<(BufferId, Vec<u8>)> = (0..LAYERS)
        .map(|i| {
            let (id, _) = engine.alloc(CHUNK, options.clone()).unwrap();
            (id, fill(engine, id, CHUNK, 10 + i as u64))
        })
        .collect();
    engine.page_out(Target::All).unwrap();
    layers
}

/// Runs `passes` passes over the layers in order (advancing the schedule when `prefetch` is
/// given) and returns the page-ins of the last pass.
fn run_passes(engine: &Engine, layers: &[(BufferId, Vec<u8>)], passes: usize, prefetch: Option<usize>) -> u64 {
    traced_passes(engine, layers, passes, prefetch).last().map_or(0, |pass| pass.0)
}

/// Like [`run_passes`], returning each pass's page-ins and chunks mapped afresh.
fn traced_passes(
    engine: &Engine,
    layers: &[(BufferId, Vec<u8>)],
    passes: usize,
    prefetch: Option<usize>,
) -> Vec<(u64, u64)> {
    let mut trace = Vec::new();
    for _ in 0..passes {
        let before = engine.stats().transfers;
        for (step, (id, _)) in layers.iter().enumerate() {
            if let Some(budget) = prefetch {
                engine.advance(step, budget).unwrap();
            }
            let region = [Region::whole(*id)];
            engine.acquire(&region, Access::ReadOnly, S).unwrap();
            engine.release(&region, S).unwrap();
        }
        let after = engine.stats().transfers;
        trace.push((after.page_ins - before.page_ins, after.maps - before.maps));
    }
    trace
}

fn schedule_of(layers: &[(BufferId, Vec<u8>)]) -> Vec<Vec<BufferId>> {
    layers.iter().map(|(id, _)| vec![*id]).collect()
}

#[test]
fn with_the_schedule_a_loop_larger_than_hbm_streams_only_the_excess() {
    // The policy's LRU first: no loop learned from the acquires (learned_loops.rs tests that).
    let (engine, sim) = support::engine(CAP, 64, EngineConfig { learn_loops: None, ..support::config() });
    let layers = layers(&engine);
    // LRU: every layer leaves just before it is needed again.
    assert_eq!(run_passes(&engine, &layers, 3, None), LAYERS as u64);
    engine.set_schedule(schedule_of(&layers)).unwrap();
    // Belady keeps CAP - 1 layers resident for good; the last slot streams the rest.
    assert_eq!(run_passes(&engine, &layers, 3, Some(0)), (LAYERS - CAP + 1) as u64);
    for (id, bytes) in &layers {
        assert_contents(&engine, *id, bytes);
    }
    support::assert_no_leaks(engine, sim);
}

#[test]
fn paging_ahead_brings_layers_in_before_they_are_acquired() {
    let (engine, sim) = support::engine(CAP, 64, support::config());
    let layers = layers(&engine);
    engine.set_schedule(schedule_of(&layers)).unwrap();
    let budget = 2 * CHUNK;
    let per_pass = run_passes(&engine, &layers, 4, Some(budget));
    // A window of two chunks takes one more slot from the resident set than demand paging.
    assert_eq!(per_pass, (LAYERS - CAP + 2) as u64);
    let transfers = engine.stats().transfers;
    assert!(transfers.prefetched > 0, "nothing was paged ahead: {transfers:?}");
    for (id, bytes) in &layers {
        assert_contents(&engine, *id, bytes);
    }
    support::assert_no_leaks(engine, sim);
}

#[test]
fn paging_ahead_never_evicts_what_is_needed_sooner() {
    let (engine, sim) = support::engine(CAP, 64, support::config());
    let layers = layers(&engine);
    engine.set_schedule(schedule_of(&layers)).unwrap();
    // Steps 0..CAP resident; a huge budget at step 0 must not push any of them out to bring
    // in later steps: every victim must be needed later than what replaces it.
    engine.page_in(Target::All).unwrap_err(); // more than the cap: refused, nothing moved
    for (id, _) in &layers[..CAP] {
        engine.page_in(Target::Buffer(*id)).unwrap();
    }
    assert_eq!(engine.advance(0, usize::MAX).unwrap(), 0);
    for (id, _) in &layers[..CAP] {
        assert_eq!(support::buffer_stats(&engine, *id).in_hbm, 1, "layer {id} was evicted");
    }
    // At step 2, layers 0 and 1 are needed furthest away: exactly they make room for 4 and 5.
    assert_eq!(engine.advance(2, usize::MAX).unwrap(), 2 * CHUNK);
    let resident: Vec<usize> =
        (0..LAYERS).filter(|&i| support::buffer_stats(&engine, layers[i].0).in_hbm == 1).collect();
    assert_eq!(resident, vec![2, 3, 4, 5]);
    for (id, bytes) in &layers {
        assert_contents(&engine, *id, bytes);
    }
    support::assert_no_leaks(engine, sim);
}

#[test]
fn a_budget_grown_past_the_loop_ends_its_streaming() {
    // Streamed chunks come back to their homes (homes.rs) while HBM is short; once the budget
    // holds the whole loop, they take the free room instead and nothing streams any more.
    let (engine, sim) = support::engine(LAYERS + 2, 64, support::config());
    let layers = layers(&engine);
    engine.finish(engine.set_hbm_budget(CAP * CHUNK).unwrap()).unwrap();
    engine.set_schedule(schedule_of(&layers)).unwrap();
    assert_eq!(run_passes(&engine, &layers, 3, Some(0)), (LAYERS - CAP + 1) as u64);
    engine.finish(engine.set_hbm_budget((LAYERS + 2) * CHUNK).unwrap()).unwrap();
    let trace = traced_passes(&engine, &layers, 3, Some(0));
    assert!(trace[0].0 <= (LAYERS - CAP + 1) as u64, "{trace:?}");
    assert_eq!((trace[1].0, trace[2].0), (0, 0), "the loop fits: (page-ins, maps) per pass {trace:?}");
    for (id, bytes) in &layers {
        assert_contents(&engine, *id, bytes);
    }
    support::assert_no_leaks(engine, sim);
}

#[test]
fn a_loop_that_fits_pages_ahead_again_once_a_chunk_has_left() {
    // Every layer resident: `advance` finds nothing to bring in, and remembers that until a
    // chunk leaves HBM (schedule.rs, "Nothing to page in") — then it brings it back ahead of use.
    let (engine, sim) = support::engine(LAYERS + 2, 64, support::config());
    let layers = layers(&engine);
    engine.set_schedule(schedule_of(&layers)).unwrap();
    let window = LAYERS * CHUNK;
    assert_eq!(engine.advance(0, window).unwrap(), LAYERS * CHUNK, "the whole loop comes in");
    engine.page_in(Target::All).unwrap();
    for step in [0, 3, 9, 0] {
        assert_eq!(engine.advance(step, window).unwrap(), 0, "nothing is missing at step {step}");
    }
    for (gone, step) in [(7, 2), (2, 9)] {
        engine.page_out(Target::Buffer(layers[gone].0)).unwrap();
        assert_eq!(engine.advance(step, window).unwrap(), CHUNK, "layer {gone} left: it comes back");
        assert_eq!(engine.advance(step, window).unwrap(), 0);
    }
    // A buffer of the schedule freed: the walk sees the others still resident.
    engine.free(layers[5].0).unwrap();
    assert_eq!(engine.advance(0, window).unwrap(), 0);
    assert_eq!(run_passes(&engine, &layers[..5], 2, Some(window)), 0, "the loop fits: no page-in");
    for (id, bytes) in layers.iter().filter(|(id, _)| *id != layers[5].0) {
        assert_contents(&engine, *id, bytes);
    }
    support::assert_no_leaks(engine, sim);
}

#[test]
fn schedule_errors_name_the_call_and_change_nothing() {
    let (engine, sim) = support::engine(CAP, 64, support::config());
    let layers = layers(&engine);
    let err = engine.advance(0, CHUNK).unwrap_err();
    assert!(matches!(err, Error::Schedule { call: "advance", .. }), "{err}");
    assert!(err.to_string().contains("no schedule"), "{err}");
    let err = engine.set_schedule(vec![vec![layers[0].0, BufferId(999)]]).unwrap_err();
    assert!(matches!(err, Error::UnknownBuffer { call: "set_schedule", .. }), "{err}");
    assert!(matches!(engine.set_schedule(vec![]), Err(Error::Schedule { .. })));
    engine.set_schedule(schedule_of(&layers)).unwrap();
    let err = engine.advance(LAYERS, CHUNK).unwrap_err();
    assert!(err.to_string().contains("outside the schedule of 10 steps"), "{err}");
    // A freed buffer leaves the schedule; the rest goes on working.
    engine.free(layers[3].0).unwrap();
    assert_eq!(engine.advance(2, 2 * CHUNK).unwrap(), 2 * CHUNK);
    engine.clear_schedule();
    assert!(engine.advance(0, CHUNK).is_err());
    for (id, bytes) in layers.iter().filter(|(id, _)| *id != layers[3].0) {
        assert_contents(&engine, *id, bytes);
    }
    support::assert_no_leaks(engine, sim);
}

/// Model-like loops: layers of unequal buffers (like q, k, v, o, gate, up, down, norms, with
/// an embedding and a head), bigger than the cap, paged ahead through a window. Once warm, a
/// pass moves what does not fit plus the window and the step in use (the largest buffer), and
/// the streamed chunks come back to the physical chunks they left, so their stale mappings
/// serve again and nothing (waiting for victims) or little (not waiting) is mapped afresh.
#[test]
fn model_like_loops_move_only_what_does_not_fit_and_map_nothing() {
    let sizes = [4, 1, 1, 4, 14, 14, 14, 1, 1];
    let geometries = [(8, 0.5, 16), (8, 0.4, 64), (6, 0.6, 32), (8, 0.3, 8)];
    for ((layers, cap_fraction, window), ahead_waits) in geometries.into_iter().flat_map(|g| [(g, true), (g, false)]) {
        let mut all = vec![16];
        all.extend((0..layers).flat_map(|_| sizes));
        all.push(16);
        let total: usize = all.iter().sum();
        let cap = (total as f64 * cap_fraction) as usize;
        let (engine, sim) = support::engine(cap, total + 8, EngineConfig { ahead_waits, ..support::config() });
        let options = AllocOptions { read_only: true, ..AllocOptions::default() };
        let buffers: Vec<(BufferId, Vec<u8>)> = all
            .iter()
            .enumerate()
            .map(|(i, &chunks)| {
                let (id, _) = engine.alloc(chunks * CHUNK, options.clone()).unwrap();
                (id, fill(&engine, id, chunks * CHUNK, 100 + i as u64))
            })
            .collect();
        engine.page_out(Target::All).unwrap();
        engine.set_schedule(schedule_of(&buffers)).unwrap();
        let trace = traced_passes(&engine, &buffers, 5, Some(window * CHUNK));
        let bound = (total - cap + window + 16) as u64;
        let geometry = format!(
            "{total} chunks, cap {cap}, window {window}, ahead waits {ahead_waits}: (page-ins, maps) per pass {trace:?}"
        );
        // A page-ahead that waits for its victims moves no more than the bound in any warm
        // pass. One that does not wait moves what the GPU's timing lets it: on the H200 a warm
        // pass now and then brings more (364 against 359, then 350 and 350; 328, 382, 355:
        // BENCHMARKS.md, twenty-seventh session), so its typical (median) pass is held to the
        // bound and none may exceed it by more than 10%.
        let mut warm: Vec<u64> = trace[2..].iter().map(|&(page_ins, _)| page_ins).collect();
        warm.sort_unstable();
        let (typical, most) = (warm[warm.len() / 2], warm[warm.len() - 1]);
        match ahead_waits {
            true => assert!(most <= bound, "more than {bound} page-ins; {geometry}"),
            false => assert!(typical <= bound && most * 10 <= bound * 11, "over {bound} page-ins; {geometry}"),
        }
        // Streamed chunks come back to their homes. A page-ahead that waits for its victims
        // finds every home free: no chunk is mapped afresh once the planned resident set has
        // settled (a pass later than Belady's own: its second pass still evicts, for the first
        // time, chunks the cold pass left resident). One that does not wait places a
        // chunk whose home is still on its way down elsewhere: some maps in the first warm
        // passes, no more as the passes go (on the H200 before the planned resident set, in
        // the second geometry: 169, 55, 0 of ~350 page-ins in one run, 197, 162, 65 in
        // another; 47, 11, 2 of 260 in the first; in a later run, over twelve passes, 127, 66,
        // 159, 47, 61, 37, 24, 26, 4, 0 of ~352. With it: 171, 93, 126 in two runs of three;
        // over twelve passes 120, 134, 60, 58, 1, 0 … Both settle, at a pace the GPU's timing
        // sets, so the fifth pass is allowed half: bench/results/probes-20261127d/).
        let (first_warm, last) = (trace[2], trace[4]);
        match ahead_waits {
            true => assert!(trace[3..].iter().all(|&(_, maps)| maps == 0), "{geometry}"),
            false => assert!(last.1 <= first_warm.1 && last.1 * 2 <= last.0, "{geometry}"),
        }
        for (id, bytes) in &buffers {
            assert_contents(&engine, *id, bytes);
        }
        support::assert_no_leaks(engine, sim);
    }
}

/// Looking past resident steps (schedule.rs): with a window of two one-chunk layers and a cap
/// of six, Belady keeps four layers resident (the last two and the first two: a stretch of
/// four steps longer than the window) and streams the rest through two chunks. Looking past the
/// window, the first streamed layers come in while the program is still in that stretch —
/// each in exchange for a streamed layer whose work is done, into its own home — instead of a
/// step before their use. The resident set is not eroded (a pass streams only what does not
/// fit, plus the window), nothing is mapped afresh once warm, and every byte survives.
#[test]
fn paging_ahead_looks_past_resident_steps_without_eroding_them() {
    const CAP: usize = 6;
    let window = 2 * CHUNK;
    let mut leads = Vec::new();
    for look_past in [true, false] {
        // Paging ahead waits for its victims, so no chunk is mapped afresh once warm (without
        // waiting the H200 saw 2 now and then). Which streamed layer a look past swaps out
        // depends on what the GPU has finished, so on a GPU a warm pass may bring in up to a
        // window more than the bound (8 against 6 in one of two runs, twenty-seventh session).
        let config = EngineConfig { look_past, ahead_waits: true, ..support::config() };
        let (engine, sim) = support::engine(CAP, LAYERS + 2, config);
        let layers = layers(&engine);
        engine.set_schedule(schedule_of(&layers)).unwrap();
        let warm = traced_passes(&engine, &layers, 4, Some(window));
        let slack = if sim.is_none() && look_past { 2 } else { 0 };
        let bound = (LAYERS - CAP + 2 + slack) as u64;
        for &(page_ins, maps) in &warm[2..] {
            assert!(page_ins <= bound, "look_past {look_past}: more than {bound} page-ins a pass: {warm:?}");
            assert_eq!(maps, 0, "look_past {look_past}: {warm:?}");
        }
        // Two more passes, noting after each advance which layers are in HBM; a layer's lead
        // is how many steps before its use it was there.
        let mut seen = Vec::new();
        for _ in 0..2 {
            for (step, (id, _)) in layers.iter().enumerate() {
                engine.advance(step, window).unwrap();
                let stats = engine.stats();
                seen.push(
                    layers
                        .iter()
                        .map(|(l, _)| stats.buffers.iter().any(|b| b.id == *l && b.in_hbm == 1))
                        .collect::<Vec<_>>(),
                );
                let region = [Region::whole(*id)];
                engine.acquire(&region, Access::ReadOnly, S).unwrap();
                engine.release(&region, S).unwrap();
            }
        }
        let lead = (0..LAYERS)
            .map(|layer| (1..LAYERS).take_while(|&back| seen[LAYERS + layer - back][layer]).count())
            .filter(|&lead| lead < LAYERS - 1)
            .max()
            .unwrap_or(0);
        for (id, bytes) in &layers {
            assert_contents(&engine, *id, bytes);
        }
        if sim.is_some() {
            leads.push(lead);
        }
        support::assert_no_leaks(engine, sim);
    }
    if let [with, without] = leads[..] {
        assert!(with >= 3, "looking past, a streamed layer arrives during the resident stretch: lead {with} steps");
        assert!(without <= 1, "without, a window of two steps brings each layer one step ahead: lead {without}");
    }
}
