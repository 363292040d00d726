//! Handing over (handover.rs): chunks coming in take the physical chunks of chunks still
//! leaving, their copies waiting for the leaving chunks' last uses on the device. A kernel
//! enqueued before a chunk left must still read that chunk's bytes, whatever the timing: here
//! every step's "kernel" copies its layer to pinned memory on the program's stream, the host
//! reads those copies only at the end of each pass, and every byte is checked. Runs on the GPU
//! too (`TIERMEM_TEST_BACKEND=cuda`), where the GPU's own timing decides.

mod support;

use support::{assert_contents, fill, CHUNK};
use tiermem::mechanism::sim::Timing;
use tiermem::mechanism::StreamPriority;
use tiermem::{Access, AllocOptions, BufferId, EngineConfig, Region, Target};

const LAYERS: usize = 12;
const CAP: usize = 5;

#[test]
fn kernels_read_their_chunks_while_later_chunks_take_them_over() {
    for (timing, window, purpose) in
        [(Timing::Lazy, 2, "ahead"), (Timing::Random, 1, "ahead"), (Timing::Lazy, 0, "demand")]
    {
        let (engine, sim) = support::engine(CAP, 4 * LAYERS, EngineConfig::default());
        if let Some(sim) = &sim {
            sim.set_timing(timing);
        }
        let options = AllocOptions { read_only: true, ..AllocOptions::default() };
        let layers: Vec<(BufferId, Vec<u8>)> = (0..LAYERS)
            .map(|i| {
                let (id, _) = engine.alloc(CHUNK, options.clone()).unwrap();
                (id, fill(&engine, id, CHUNK, 40 + i as u64))
            })
            .collect();
        engine.page_out(Target::All).unwrap();
        engine.set_schedule(layers.iter().map(|(id, _)| vec![*id]).collect()).unwrap();
        let device = engine.device();
        let stream = device.create_stream(StreamPriority::High).unwrap();
        let staging = device.alloc_pinned(LAYERS * CHUNK).unwrap();
        for pass in 0..4 {
            for (step, (id, _)) in layers.iter().enumerate() {
                if window > 0 {
                    engine.advance(step, window * CHUNK).unwrap();
                }
                let region = [Region::whole(*id)];
                engine.acquire(&region, Access::ReadOnly, stream).unwrap();
                let va = engine.device_ptr(*id).unwrap();
                // SAFETY: each step copies into its own chunk of the pinned staging, which the
                // host reads only after synchronizing the stream, below.
                unsafe { device.copy_to_host_async(staging + step * CHUNK, va, CHUNK, stream) }.unwrap();
                engine.release(&region, stream).unwrap();
            }
            device.synchronize_stream(stream).unwrap();
            for (step, (_, bytes)) in layers.iter().enumerate() {
                // SAFETY: the copies into the staging have completed (the stream is synchronized).
                let read = unsafe { std::slice::from_raw_parts((staging + step * CHUNK) as *const u8, CHUNK) };
                assert!(read == &bytes[..], "{timing:?}, {purpose}: pass {pass}, layer {step} read other bytes");
            }
        }
        let handovers = engine.stats().transfers.handovers;
        if sim.is_some() {
            assert!(handovers > 0, "{timing:?}, {purpose}: no chunk was handed over");
        }
        device.free_pinned(staging, LAYERS * CHUNK).unwrap();
        device.destroy_stream(stream).unwrap();
        for (id, bytes) in &layers {
            assert_contents(&engine, *id, bytes);
        }
        support::assert_no_leaks(engine, sim);
    }
}
