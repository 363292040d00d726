//! The ceilings: raw pinned copies with no tiermem in the way, timed with device events.

use super::median;
use std::sync::Arc;
use tiermem::mechanism::{Device, DevicePtr, EventHandle, HostPtr, StreamHandle, StreamPriority};

pub struct Ceilings {
    pub h2d_gbps: f64,
    pub d2h_gbps: f64,
    pub bidir_gbps: f64,
}

/// Raw `cuMemcpy*Async` between pinned host memory and a plain device allocation.
pub fn measure(device: &Arc<dyn Device>, size: usize, reps: usize) -> Result<Ceilings, String> {
    let d = device.as_ref();
    let err = |e: tiermem::mechanism::DeviceError| format!("bench raw: {e}");
    let host = [d.alloc_pinned(size).map_err(err)?, d.alloc_pinned(size).map_err(err)?];
    let dev = [d.alloc_plain(size).map_err(err)?, d.alloc_plain(size).map_err(err)?];
    let streams =
        [d.create_stream(StreamPriority::High).map_err(err)?, d.create_stream(StreamPriority::High).map_err(err)?];
    let events: Vec<EventHandle> = (0..4).map(|_| d.create_event(true)).collect::<Result<_, _>>().map_err(err)?;
    let gb = size as f64 / 1e9;
    let time = |up: bool, down: bool| -> Result<f64, String> {
        let mut samples = Vec::new();
        for rep in 0..reps + 2 {
            d.record_event(events[0], streams[0]).map_err(err)?;
            d.stream_wait_event(streams[1], events[0]).map_err(err)?;
            if up {
                copy(d, true, dev[0], host[0], size, streams[0])?;
            }
            if down {
                copy(d, false, dev[1], host[1], size, streams[1])?;
            }
            d.record_event(events[1], streams[0]).map_err(err)?;
            d.record_event(events[2], streams[1]).map_err(err)?;
            d.synchronize_event(events[1]).map_err(err)?;
            d.synchronize_event(events[2]).map_err(err)?;
            let ms =
                d.elapsed_ms(events[0], events[1]).map_err(err)?.max(d.elapsed_ms(events[0], events[2]).map_err(err)?);
            if rep >= 2 {
                samples.push(ms as f64 / 1e3);
            }
        }
        Ok(median(samples))
    };
    let h2d = gb / time(true, false)?;
    let d2h = gb / time(false, true)?;
    let bidir = 2.0 * gb / time(true, true)?;
    for e in events {
        d.destroy_event(e).map_err(err)?;
    }
    for s in streams {
        d.destroy_stream(s).map_err(err)?;
    }
    for p in dev {
        d.free_plain(p).map_err(err)?;
    }
    for h in host {
        d.free_pinned(h, size).map_err(err)?;
    }
    Ok(Ceilings { h2d_gbps: h2d, d2h_gbps: d2h, bidir_gbps: bidir })
}

fn copy(
    d: &dyn Device,
    up: bool,
    dev: DevicePtr,
    host: HostPtr,
    size: usize,
    stream: StreamHandle,
) -> Result<(), String> {
    // SAFETY: `host` is pinned memory of `size` bytes from this device, alive until `measure`
    // frees it after synchronising every copy.
    let result = unsafe {
        if up {
            d.copy_to_device_async(dev, host, size, stream)
        } else {
            d.copy_to_host_async(host, dev, size, stream)
        }
    };
    result.map_err(|e| format!("bench raw: {e}"))
}

/// Host time of VMM bookkeeping per chunk, on one thread and split over two threads.
pub struct VmmCosts {
    pub map_us: f64,
    pub unmap_us: f64,
    pub map_us_2threads: f64,
    pub unmap_us_2threads: f64,
}

/// Maps (with access, 16 chunks per `cuMemSetAccess`) and unmaps `chunks` chunks, first on
/// one thread, then as two halves on two threads at once: does the driver serialise them?
pub fn vmm_costs(device: &Arc<dyn Device>, chunks: usize) -> Result<VmmCosts, String> {
    let err = |e: tiermem::mechanism::DeviceError| format!("bench vmm: {e}");
    let g = device.info().granularity;
    let va = device.reserve(chunks * g).map_err(err)?;
    let phys: Vec<_> = (0..chunks).map(|_| device.create_chunk()).collect::<Result<_, _>>().map_err(err)?;
    let map = |range: std::ops::Range<usize>| -> Result<(), String> {
        let end = range.end;
        for batch in range.step_by(16).map(|i| i..(i + 16).min(end)) {
            for i in batch.clone() {
                device.map(va + (i * g) as u64, phys[i]).map_err(err)?;
            }
            device.set_access(va + (batch.start * g) as u64, batch.len() * g).map_err(err)?;
        }
        Ok(())
    };
    let unmap = |range: std::ops::Range<usize>| -> Result<(), String> {
        let end = range.end;
        range.step_by(16).try_for_each(|i| device.unmap(va + (i * g) as u64, 16.min(end - i) * g).map_err(err))
    };
    let per_chunk = |t: std::time::Instant| t.elapsed().as_secs_f64() * 1e6 / chunks as f64;
    let half = chunks / 2;
    let (mut one, mut two) = ([0.0; 2], [0.0; 2]);
    for round in 0..2 {
        let t = std::time::Instant::now();
        map(0..chunks)?;
        let m = per_chunk(t);
        let t = std::time::Instant::now();
        unmap(0..chunks)?;
        one = if round == 1 { [m, per_chunk(t)] } else { one };
        let t = std::time::Instant::now();
        std::thread::scope(|s| {
            let other = s.spawn(|| map(half..chunks));
            map(0..half).and(other.join().expect("mapping thread"))
        })?;
        let m = per_chunk(t);
        let t = std::time::Instant::now();
        std::thread::scope(|s| {
            let other = s.spawn(|| unmap(half..chunks));
            unmap(0..half).and(other.join().expect("unmapping thread"))
        })?;
        two = if round == 1 { [m, per_chunk(t)] } else { two };
    }
    for p in phys {
        device.release_chunk(p).map_err(err)?;
    }
    device.unreserve(va, chunks * g).map_err(err)?;
    Ok(VmmCosts { map_us: one[0], unmap_us: one[1], map_us_2threads: two[0], unmap_us_2threads: two[1] })
}

/// Host time per chunk of mapping with access (16 chunks per `cuMemSetAccess`) while the copy
/// engines are idle, busy copying device → host, and busy copying host → device (plain
/// allocations, not tiermem's): does mapping wait for copies in flight?
pub struct MapStall {
    pub idle_us: f64,
    pub during_d2h_us: f64,
    pub during_h2d_us: f64,
    /// During the same copy down issued on a low-priority stream.
    pub during_d2h_low_priority_us: f64,
    /// During the same copy down issued as 2 MiB copies.
    pub during_d2h_pieces_us: f64,
    /// Microseconds of each batch of 16 chunks during the device-to-host copy.
    pub d2h_batches_us: Vec<f64>,
}

pub fn map_stall(device: &Arc<dyn Device>, copy_bytes: usize) -> Result<MapStall, String> {
    const CHUNKS: usize = 64;
    let d = device.as_ref();
    let err = |e: tiermem::mechanism::DeviceError| format!("bench map stall: {e}");
    let g = d.info().granularity;
    let va = d.reserve(CHUNKS * g).map_err(err)?;
    let phys: Vec<_> = (0..CHUNKS).map(|_| d.create_chunk()).collect::<Result<_, _>>().map_err(err)?;
    let (host, plain) = (d.alloc_pinned(copy_bytes).map_err(err)?, d.alloc_plain(copy_bytes).map_err(err)?);
    let high = d.create_stream(StreamPriority::High).map_err(err)?;
    let low = d.create_stream(StreamPriority::Low).map_err(err)?;
    // What runs on the copy engines meanwhile: (up, stream, bytes per copy).
    let timed = |load: Option<(bool, StreamHandle, usize)>| -> Result<Vec<f64>, String> {
        if let Some((up, stream, piece)) = load {
            for offset in (0..copy_bytes).step_by(piece) {
                copy(d, up, plain + offset as u64, host + offset, piece.min(copy_bytes - offset), stream)?;
            }
        }
        let mut batches = Vec::new();
        for first in (0..CHUNKS).step_by(16) {
            let t = std::time::Instant::now();
            for (i, &chunk) in phys.iter().enumerate().skip(first).take(16) {
                d.map(va + (i * g) as u64, chunk).map_err(err)?;
            }
            d.set_access(va + (first * g) as u64, 16 * g).map_err(err)?;
            batches.push(t.elapsed().as_secs_f64() * 1e6);
        }
        for stream in [high, low] {
            d.synchronize_stream(stream).map_err(err)?;
        }
        d.unmap(va, CHUNKS * g).map_err(err)?;
        Ok(batches)
    };
    let per_chunk = |b: &[f64]| b.iter().sum::<f64>() / CHUNKS as f64;
    timed(None)?;
    let idle = timed(None)?;
    let d2h = timed(Some((false, high, copy_bytes)))?;
    let h2d = timed(Some((true, high, copy_bytes)))?;
    let low_priority = timed(Some((false, low, copy_bytes)))?;
    let pieces = timed(Some((false, high, g)))?;
    let stall = MapStall {
        idle_us: per_chunk(&idle),
        during_d2h_us: per_chunk(&d2h),
        during_h2d_us: per_chunk(&h2d),
        during_d2h_low_priority_us: per_chunk(&low_priority),
        during_d2h_pieces_us: per_chunk(&pieces),
        d2h_batches_us: d2h,
    };
    for stream in [high, low] {
        d.destroy_stream(stream).map_err(err)?;
    }
    d.free_plain(plain).map_err(err)?;
    d.free_pinned(host, copy_bytes).map_err(err)?;
    phys.into_iter().try_for_each(|p| d.release_chunk(p)).map_err(err)?;
    d.unreserve(va, CHUNKS * g).map_err(err)?;
    Ok(stall)
}
