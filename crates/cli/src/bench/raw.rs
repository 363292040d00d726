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
    let streams = [d.create_stream(StreamPriority::High).map_err(err)?, d.create_stream(StreamPriority::High).map_err(err)?];
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
            let ms = d.elapsed_ms(events[0], events[1]).map_err(err)?.max(d.elapsed_ms(events[0], events[2]).map_err(err)?);
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

fn copy(d: &dyn Device, up: bool, dev: DevicePtr, host: HostPtr, size: usize, stream: StreamHandle) -> Result<(), String> {
    // SAFETY: `host` is pinned memory of `size` bytes from this device, alive until `measure`
    // frees it after synchronising every copy.
    let result = unsafe {
        if up { d.copy_to_device_async(dev, host, size, stream) } else { d.copy_to_host_async(host, dev, size, stream) }
    };
    result.map_err(|e| format!("bench raw: {e}"))
}
