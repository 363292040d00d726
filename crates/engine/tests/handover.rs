//! Hand-overs (hand_overs.rs): a dirty chunk leaving HBM gives its physical chunk to the chunk
//! coming in while its copy down still runs, and the copy in (or the zero fill) waits for it on
//! the device, not the host — for a streamed chunk coming home, and for chunks coming in as
//! zeros. On a simulated device that runs work only when waited for (`Timing::Lazy`), or late
//! and at random, every copy down is still queued when its chunk is handed over: the bytes
//! must all survive, round after round, and a chunk brought back before its copy down ran must
//! read what it last wrote.

mod support;

use std::sync::Arc;
use support::{pattern, sim_engine, CHUNK};
use tiermem::mechanism::sim::{SimDevice, Timing};
use tiermem::mechanism::{DevicePtr, StreamHandle, StreamPriority};
use tiermem::{Access, AllocOptions, BufferId, Engine, EngineConfig, Region, Target};

const BUFFERS: usize = 24;
const CAP: usize = 16;

/// The value buffer `i` holds after round `round`.
fn value(round: usize, i: usize) -> u8 {
    (round * 31 + i * 7 + 1) as u8
}

/// An engine on a simulated GPU with `timing`, loops learned or not, a stream of the program's
/// and `BUFFERS` one-chunk buffers.
fn setup(timing: Timing, seed: u64, learn: bool) -> (Engine, Arc<SimDevice>, StreamHandle, Vec<(BufferId, DevicePtr)>) {
    let config = EngineConfig { learn_loops: learn.then_some(4 * CHUNK), stride_prefetch: 0, ..support::config() };
    let (engine, sim) = sim_engine(CAP + 8, CAP, 4 * BUFFERS, config);
    sim.set_timing(timing);
    sim.set_seed(seed);
    let stream = engine.device().create_stream(StreamPriority::Low).unwrap();
    let buffers = (0..BUFFERS).map(|_| engine.alloc(CHUNK, AllocOptions::default()).unwrap()).collect();
    (engine, sim, stream, buffers)
}

/// Rounds over `BUFFERS` one-chunk buffers, more than the cap holds, each acquired for writing
/// and overwritten on the GPU (a memset on the program's stream) in the same order every
/// round, so the engine learns the loop and streams what does not fit, dirty. Every byte is
/// checked at the end.
fn dirty_rounds(timing: Timing, seed: u64, rounds: usize) -> u64 {
    let (engine, sim, stream, buffers) = setup(timing, seed, true);
    for round in 0..rounds {
        for (i, &(id, va)) in buffers.iter().enumerate() {
            let region = [Region::whole(id)];
            engine.acquire(&region, Access::ReadWrite, stream).unwrap();
            engine.device().memset_async(va, value(round, i), CHUNK, stream).unwrap();
            engine.release(&region, stream).unwrap();
        }
    }
    engine.device().synchronize_stream(stream).unwrap();
    for (i, &(id, _)) in buffers.iter().enumerate() {
        let mut back = vec![0u8; CHUNK];
        engine.read(id, 0, &mut back).unwrap();
        let want = value(rounds - 1, i);
        let wrong = back.iter().filter(|&&b| b != want).count();
        assert_eq!(wrong, 0, "{timing:?}, seed {seed}: buffer {i} has {wrong} bytes other than round {rounds}'s");
    }
    let handed = engine.stats().transfers.handed_over;
    engine.device().destroy_stream(stream).unwrap();
    support::assert_no_leaks(engine, Some(sim));
    handed
}

#[test]
fn dirty_streaming_hands_homes_over_and_loses_no_byte() {
    // Lazy: no copy down runs before something waits for it, so every home is handed over
    // while its holder's copy is queued.
    assert!(dirty_rounds(Timing::Lazy, 0, 6) > 0, "a lazy GPU: homes are handed over");
    for seed in 0..12 {
        dirty_rounds(Timing::Random, seed, 5);
        dirty_rounds(Timing::Eager, seed, 4);
    }
}

/// Activations: every round writes each buffer afresh — discarded the round before, so it
/// comes in as zeros — while HBM is full of the dirty ones written before it, then reads them
/// back in reverse and discards them. Each zero fill takes the physical chunk of a dirty chunk
/// whose copy down may still be queued. With a learned loop (page-aheads) and without (demands).
fn activation_rounds(timing: Timing, seed: u64, learn: bool) -> u64 {
    let (engine, sim, stream, buffers) = setup(timing, seed, learn);
    for round in 0..4 {
        for (i, &(id, va)) in buffers.iter().enumerate() {
            let region = [Region::whole(id)];
            engine.acquire(&region, Access::ReadWrite, stream).unwrap();
            engine.device().memset_async(va, value(round, i), CHUNK / 2, stream).unwrap();
            engine.release(&region, stream).unwrap();
        }
        engine.device().synchronize_stream(stream).unwrap();
        for (i, &(id, _)) in buffers.iter().enumerate().rev() {
            let mut back = vec![0u8; CHUNK];
            engine.read(id, 0, &mut back).unwrap();
            let wrong = back[..CHUNK / 2].iter().filter(|&&b| b != value(round, i)).count();
            assert_eq!(wrong, 0, "{timing:?}, seed {seed}, round {round}: buffer {i} read back wrong");
            engine.discard(&[Region::whole(id)]).unwrap();
        }
    }
    let handed = engine.stats().transfers.handed_over;
    engine.device().destroy_stream(stream).unwrap();
    support::assert_no_leaks(engine, Some(sim));
    handed
}

#[test]
fn zero_fills_take_chunks_still_copied_down_and_lose_no_byte() {
    for learn in [false, true] {
        assert!(activation_rounds(Timing::Lazy, 0, learn) > 0, "a lazy GPU: zero fills take chunks still moving");
        for seed in 0..8 {
            activation_rounds(Timing::Random, seed, learn);
            activation_rounds(Timing::Eager, seed, learn);
        }
    }
}

/// A chunk handed over and wanted again at once, before its copy down ran: it comes back from
/// its host slot behind that copy (to another physical chunk: its own went to the chunk that
/// came home), and a page-out, a spill of its slot to nowhere (no file tier) or a free meanwhile
/// lose nothing and leak nothing.
#[test]
fn a_chunk_handed_over_comes_back_with_its_bytes() {
    let (engine, sim, stream, buffers) = setup(Timing::Lazy, 0, true);
    let mut last = [0u8; BUFFERS];
    for round in 0..4 {
        for (i, &(id, va)) in buffers.iter().enumerate() {
            let region = [Region::whole(id)];
            engine.acquire(&region, Access::ReadWrite, stream).unwrap();
            engine.device().memset_async(va, value(round, i), CHUNK, stream).unwrap();
            engine.release(&region, stream).unwrap();
            last[i] = value(round, i);
            // Out of order, now and then: the buffer evicted for the one just acquired.
            if round >= 2 && i % 5 == 4 {
                let j = (i + BUFFERS - 3) % BUFFERS;
                // The program's own order: its write of j (on its stream) before this read (on
                // the legacy one). Only that stream runs; the copies down stay queued.
                engine.device().synchronize_stream(stream).unwrap();
                let mut back = vec![0u8; CHUNK];
                engine.read(buffers[j].0, 0, &mut back).unwrap();
                assert!(back.iter().all(|&b| b == last[j]), "round {round}: buffer {j} read back wrong");
            }
        }
    }
    assert!(engine.stats().transfers.handed_over > 0);
    engine.page_out(Target::All).unwrap();
    let (extra, _) = engine.alloc(CHUNK, AllocOptions::default()).unwrap();
    engine.write(extra, 0, &pattern(9, CHUNK)).unwrap();
    for (i, &(id, _)) in buffers.iter().enumerate() {
        let mut back = vec![0u8; CHUNK];
        engine.read(id, 0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == last[i]), "buffer {i} lost its bytes");
    }
    for &(id, _) in &buffers {
        engine.free(id).unwrap();
    }
    engine.free(extra).unwrap();
    engine.device().synchronize_stream(stream).unwrap();
    engine.device().destroy_stream(stream).unwrap();
    support::assert_no_leaks(engine, Some(sim));
}
