//! The HBM budget changes while the engine runs (`Engine::set_hbm_budget`): a smaller one is
//! met (the excess sent down, its HBM given back to the driver), acquired chunks are never
//! taken away, a larger one is used at once, and no byte is lost — also while another thread
//! acquires and releases buffers as the budget moves.

mod support;

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use support::{assert_contents, assert_no_leaks, fill, pattern, CHUNK};
use tiermem::Tier;
use tiermem::{Access, AllocOptions, Engine, EngineConfig, Error, Region, StreamHandle, Target};

const S: StreamHandle = StreamHandle(0);

/// Physical chunks the simulated device holds for the engine, or what the engine says it uses.
fn chunks_held(engine: &Engine, sim: &Option<std::sync::Arc<tiermem::mechanism::sim::SimDevice>>) -> usize {
    match sim {
        Some(sim) => sim.live().chunks,
        None => engine.stats().tiers[Tier::Hbm].chunks,
    }
}

#[test]
fn a_smaller_budget_is_met_and_its_hbm_given_back_without_losing_a_byte() {
    let (engine, sim) = support::engine(8, 16, support::config());
    let e = &engine;
    let (a, _) = e.alloc(6 * CHUNK, AllocOptions::default()).unwrap();
    let bytes = fill(e, a, 6 * CHUNK, 1);
    e.page_in(Target::Buffer(a)).unwrap();
    assert_eq!(chunks_held(e, &sim), 6);

    let ticket = e.set_hbm_budget(2 * CHUNK).unwrap();
    e.finish(ticket).unwrap();
    assert_eq!(e.hbm_cap(), 2 * CHUNK);
    assert_eq!(e.stats().tiers[Tier::Hbm].chunks, 2, "{}", e.stats());
    assert_eq!(chunks_held(e, &sim), 2, "the excess went back to the driver");
    assert_contents(e, a, &bytes);
    match e.acquire(&[Region::bytes(a, 0, 3 * CHUNK)], Access::ReadOnly, S) {
        Err(Error::WouldNeverFit { cap, .. }) => assert_eq!(cap, 2 * CHUNK),
        other => panic!("three chunks under a budget of two: {other:?}"),
    }
    // Host writes and reads of more than the cap go in windows that fit.
    let bytes: Vec<u8> = (0..6 * CHUNK).map(|i| (i * 7 + 3) as u8).collect();
    e.write(a, 0, &bytes).unwrap();
    let mut back = vec![0u8; 6 * CHUNK - 100];
    e.read(a, 100, &mut back).unwrap();
    assert!(back == bytes[100..], "a read of six chunks under a budget of two");

    let ticket = e.set_hbm_budget(8 * CHUNK).unwrap();
    e.finish(ticket).unwrap();
    e.page_in(Target::Buffer(a)).unwrap();
    assert_eq!(e.stats().tiers[Tier::Hbm].chunks, 6, "a larger budget is used at once");
    assert_contents(e, a, &bytes);
    e.free(a).unwrap();
    assert_no_leaks(engine, sim);
}

#[test]
fn acquired_chunks_stay_and_leave_once_released() {
    let (engine, sim) = support::engine(8, 16, support::config());
    let e = &engine;
    let (a, _) = e.alloc(4 * CHUNK, AllocOptions::default()).unwrap();
    let bytes = fill(e, a, 4 * CHUNK, 2);
    e.acquire(&[Region::whole(a)], Access::ReadOnly, S).unwrap();
    let ticket = e.set_hbm_budget(CHUNK).unwrap();
    e.finish(ticket).unwrap();
    assert_eq!(e.stats().tiers[Tier::Hbm].chunks, 4, "acquired chunks are never taken away");
    e.release(&[Region::whole(a)], S).unwrap();
    e.page_out(Target::All).unwrap(); // waits for what release sent down, and reaps
    assert!(e.stats().tiers[Tier::Hbm].chunks <= 1, "{}", e.stats());
    assert!(chunks_held(e, &sim) <= 1, "released chunks beyond the budget go back to the driver");
    assert_contents(e, a, &bytes);
    assert!(matches!(e.set_hbm_budget(usize::MAX), Err(Error::Config(m)) if m.contains("set_hbm_budget")));
    e.free(a).unwrap();
    assert_no_leaks(engine, sim);
}

/// One thread writes, acquires, releases and checks its buffers at random; another moves the
/// budget between one chunk and the whole cap. Running out of memory, or a request beyond the
/// budget of the moment, are the only errors allowed; every byte must survive.
#[test]
fn the_budget_moves_while_another_thread_acquires_and_releases() {
    let (engine, sim) = support::engine(8, 24, EngineConfig { batch_chunks: 3, ..support::config() });
    let e = &engine;
    let sizes = [3 * CHUNK + 100, CHUNK / 2, 2 * CHUNK];
    let mut buffers: Vec<_> = sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| {
            let (id, _) = e.alloc(size, AllocOptions::default()).unwrap();
            (id, fill(e, id, size, 10 + i as u64))
        })
        .collect();
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut rng = Pcg64::seed_from_u64(7);
            while !done.load(Relaxed) {
                let chunks = rng.random_range(1..=8);
                let ticket = e.set_hbm_budget(chunks * CHUNK).expect("set_hbm_budget");
                if rng.random_bool(0.5) {
                    e.finish(ticket).expect("finish of a budget change");
                } else {
                    std::mem::drop(e.finish(ticket));
                }
                std::thread::yield_now();
            }
        });
        let mut rng = Pcg64::seed_from_u64(8);
        for step in 0..3000 {
            let i = rng.random_range(0..buffers.len());
            let (id, model) = &mut buffers[i];
            let offset = rng.random_range(0..model.len());
            let len = rng.random_range(1..=CHUNK).min(model.len() - offset);
            let region = [Region::bytes(*id, offset, len)];
            let legitimate = |e: &Error| matches!(e, Error::OutOfMemory { .. } | Error::WouldNeverFit { .. });
            match rng.random_range(0..4) {
                0 => {
                    let data = pattern(step, len);
                    match e.write(*id, offset, &data) {
                        Ok(()) => model[offset..offset + len].copy_from_slice(&data),
                        Err(err) => assert!(legitimate(&err), "write: {err}"),
                    }
                }
                1 => {
                    let mut out = vec![0; len];
                    match e.read(*id, offset, &mut out) {
                        Ok(()) => assert!(out == model[offset..offset + len], "step {step}: read differs"),
                        Err(err) => assert!(legitimate(&err), "read: {err}"),
                    }
                }
                2 => match e.acquire(&region, Access::ReadOnly, S) {
                    Ok(()) => e.release(&region, S).expect("release"),
                    Err(err) => assert!(legitimate(&err), "acquire: {err}"),
                },
                _ => {
                    if let Err(err) = e.page_out(Target::Buffer(*id)) {
                        assert!(legitimate(&err), "page_out: {err}");
                    }
                }
            }
        }
        done.store(true, Relaxed);
    });
    let ticket = e.set_hbm_budget(8 * CHUNK).unwrap();
    e.finish(ticket).unwrap();
    for (id, model) in &buffers {
        assert_contents(e, *id, model);
        e.free(*id).unwrap();
    }
    assert_no_leaks(engine, sim);
}
