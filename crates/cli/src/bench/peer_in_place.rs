//! Reading in place, for the peer suite: a kernel on the borrower reads a buffer whose chunks
//! tiermem keeps in the lender's HBM, mapped in place (`Access::InPlaceOk`), against the same
//! kernel over plain memory allocated on the lender and mapped for the borrower — the ceiling.
//! The kernel is the pattern check: it reads every word and counts those that differ, so each
//! timed read is verified too.

use crate::bench::median;
use tiermem::mechanism::{ChunkLocation, Device, DevicePtr, EventHandle, StreamHandle};
use tiermem::{Access, AllocOptions, BufferId, Engine, Region, Target};

const WARMUP: usize = 2;

/// What the two reads gave, GB/s, and whether every word read matched.
pub struct InPlace {
    pub engine_gbps: f64,
    pub raw_gbps: f64,
    pub verified: bool,
}

/// Times `reps` pattern checks of `words` words at `va` (pattern of `seed`); returns the median
/// GB/s and the mismatches counted.
fn timed_check(
    d: &dyn Device,
    va: DevicePtr,
    words: usize,
    seed: u64,
    reps: usize,
    stream: StreamHandle,
) -> Result<(f64, u32), String> {
    let err = |e: tiermem::mechanism::DeviceError| format!("bench peer (in-place read): {e}");
    let counter = d.alloc_plain(4).map_err(err)?;
    let run = || -> Result<(f64, u32), String> {
        d.memset_async(counter, 0, 4, stream).map_err(err)?;
        let events: Vec<EventHandle> = (0..2).map(|_| d.create_event(true)).collect::<Result<_, _>>().map_err(err)?;
        let mut times = Vec::new();
        for rep in 0..reps + WARMUP {
            d.record_event(events[0], stream).map_err(err)?;
            d.check_pattern_async(va, words, seed, 0, counter, stream).map_err(err)?;
            d.record_event(events[1], stream).map_err(err)?;
            d.synchronize_event(events[1]).map_err(err)?;
            if rep >= WARMUP {
                times.push(f64::from(d.elapsed_ms(events[0], events[1]).map_err(err)?) / 1e3);
            }
        }
        events.into_iter().for_each(|e| drop(d.destroy_event(e)));
        let mut bad = [0u8; 4];
        d.read(counter, &mut bad).map_err(err)?;
        Ok(((words * 8) as f64 / 1e9 / median(times).max(1e-9), u32::from_ne_bytes(bad)))
    };
    let outcome = run();
    let _ = d.free_plain(counter);
    outcome
}

/// The engine's buffer `id` (`size` bytes of its pattern) paged out to the lender with HBM
/// full of another buffer, then acquired `InPlaceOk` and read by the kernel; and the same read
/// over plain memory on GPU `lender`.
pub fn measure(
    engine: &Engine,
    id: BufferId,
    size: usize,
    lender: usize,
    reps: usize,
    stream: StreamHandle,
) -> Result<InPlace, String> {
    let check = |what: &str, r: tiermem::Result<()>| r.map_err(|e| format!("bench peer ({what}): {e}"));
    let d = engine.device().as_ref();
    let words = size / 8;
    // HBM full of another buffer: no free HBM to copy the chunks into, so they are read in place.
    let filler_size = engine.hbm_cap();
    let (filler, _) =
        engine.alloc(filler_size, AllocOptions::default()).map_err(|e| format!("bench peer (alloc): {e}"))?;
    let whole = [Region::whole(id)];
    let result = (|| {
        check("page_out", engine.page_out(Target::Buffer(id)))?;
        let fill = [Region::whole(filler)];
        check("acquire", engine.acquire(&fill, Access::ReadWrite, stream))?;
        check("release", engine.release(&fill, stream))?;
        check("acquire", engine.acquire(&whole, Access::InPlaceOk, stream))?;
        let in_place = engine.stats().buffers.iter().find(|b| b.id == id).map_or(0, |b| b.in_place);
        let read = timed_check(d, engine.device_ptr(id).map_err(|e| e.to_string())?, words, id.0, reps, stream);
        check("release", engine.release(&whole, stream))?;
        let (gbps, bad) = read?;
        if in_place * engine.chunk_size() < size {
            return Err(format!("bench peer: only {in_place} chunks of the buffer were read in place"));
        }
        Ok((gbps, bad))
    })();
    let _ = engine.free(filler);
    let (engine_gbps, engine_bad) = result?;
    let (raw_gbps, raw_bad) = raw_read(d, lender, size, reps, stream)?;
    Ok(InPlace { engine_gbps, raw_gbps, verified: engine_bad == 0 && raw_bad == 0 })
}

/// The kernel over `size` bytes allocated on GPU `lender`, mapped with access for this GPU.
fn raw_read(
    d: &dyn Device,
    lender: usize,
    size: usize,
    reps: usize,
    stream: StreamHandle,
) -> Result<(f64, u32), String> {
    let err = |e: tiermem::mechanism::DeviceError| format!("bench peer (raw in-place read): {e}");
    let granules = size.div_ceil(d.info().granularity);
    let bytes = granules * d.info().granularity;
    let va = d.reserve(bytes).map_err(err)?;
    let handle = match d.create_chunks_at(ChunkLocation::Gpu(lender), granules) {
        Ok(h) => h,
        Err(e) => {
            let _ = d.unreserve(va, bytes);
            return Err(err(e));
        }
    };
    let outcome = (|| {
        d.map_sized(va, handle, bytes).map_err(err)?;
        let mapped = (|| {
            d.set_access(va, bytes).map_err(err)?;
            const SEED: u64 = 0x5eed;
            d.fill_pattern_async(va, size / 8, SEED, 0, stream).map_err(err)?;
            timed_check(d, va, size / 8, SEED, reps, stream)
        })();
        let _ = d.unmap(va, bytes);
        mapped
    })();
    let _ = d.release_chunk(handle);
    let _ = d.unreserve(va, bytes);
    outcome
}
