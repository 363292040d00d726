//! The time spent in driver calls is measured by the device's timing adaptor
//! (`tiermem_mechanism::timing`), not by timers in the engine: `Stats` reports the adaptor's
//! map and unmap time, and every chunk the engine maps afresh is one timed map call.

mod support;

use support::{assert_contents, fill, CHUNK};
use tiermem::{Access, AllocOptions, Region, StreamHandle};

#[test]
fn stats_report_the_map_and_unmap_time_the_adaptor_measured() {
    let (engine, sim) = support::sim_engine(8, 2, 64, support::config());
    let buffers: Vec<_> = (0..4)
        .map(|i| {
            let (id, _) = engine.alloc(CHUNK, AllocOptions::default()).unwrap();
            (id, fill(&engine, id, CHUNK, 50 + i))
        })
        .collect();
    // Four one-chunk buffers through a cap of two: chunks are evicted, mapped and unmapped.
    for _ in 0..3 {
        for (id, _) in &buffers {
            let region = [Region::whole(*id)];
            engine.acquire(&region, Access::ReadOnly, StreamHandle(0)).unwrap();
            engine.release(&region, StreamHandle(0)).unwrap();
        }
    }
    for (id, bytes) in &buffers {
        assert_contents(&engine, *id, bytes);
        engine.free(*id).unwrap();
    }
    let (transfers, times) = (engine.stats().transfers, engine.driver_times());
    assert!(transfers.maps > 0 && times.unmap.calls > 0 && times.create_chunk.calls > 0, "{times:?}");
    assert_eq!(times.map.calls, transfers.maps, "one timed map per chunk mapped afresh");
    assert_eq!(transfers.map_ms, times.map.ms + times.set_access.ms);
    assert_eq!(transfers.unmap_ms, times.unmap.ms);
    assert!(transfers.map_ms > 0.0 && transfers.unmap_ms > 0.0, "{transfers:?}");
    support::assert_no_leaks(engine, Some(sim));
}
