//! Room to evict into, pinned ahead of a smaller budget.
//!
//! A chunk that has lived in HBM since it was allocated has no copy below it: sending it down
//! needs a host slot, and when no free slot is pinned the eviction pins a slab first. Pinning
//! runs at 18–22 GB/s on the H200 (faulting the pages in, then `cuMemHostRegister`) against
//! 55 GB/s for the copy itself, so a tenant of the node daemon told to give HBM back spent
//! most of its `reclaim_ms_per_GiB` (81–97 ms) pinning, and a newcomer waited for it
//! (BENCHMARKS.md, twenty-seventh session).
//!
//! A linked engine's daemon link therefore asks, once the tenant has run for two seconds and
//! then once a second (crate `tiermem-tenant`, `READY_AFTER`, `READY_EVERY`), for one more
//! slab whenever the free slots fall short of the chunks in HBM without a copy below (what a
//! budget of nothing would send down), within the host tier's cap and budget. The slab is
//! pinned with the engine's lock released, so the program's calls go on meanwhile; paced, it
//! takes little from the program (pinning all at once slowed a lone tenant's first second by
//! 16–17% on the H200), and gently (`Device::alloc_pinned_gently`: two threads at CPU priority
//! nice 10 fault its pages in, where sixteen stalled the tenants' rounds once a second).
//! Room pinned ahead is speculative and pinned memory cannot be swapped, so a slab is pinned
//! only while the host keeps an eighth of its memory available after it
//! (`HostMemory::pinning_leaves_an_eighth`): tenants on a node of eight GPUs could otherwise
//! pin as much host memory as all their HBM together. A standalone engine never pins ahead (no one
//! shrinks its budget behind its back), nor does one with `TIERMEM_EVICT_ROOM=off`; a host
//! that refuses to pin more stops it for good (the eviction itself will report the error).

use crate::engine::Engine;
use crate::error::Context;
use crate::Result;
use tiermem_mechanism::HostMemory;

impl Engine {
    /// Pins one slab of host memory (up to 1 GiB) if the host tier's free slots are fewer than
    /// the chunks in HBM with no copy below, and its cap and budget allow another slab (module
    /// docs). Returns the bytes pinned: 0 when there is room enough, or no more is allowed.
    pub fn pin_room_to_evict(&self) -> Result<usize> {
        let call = "pin_room_to_evict";
        let (bytes, device) = {
            let inner = self.lock();
            let without_copy = inner
                .state
                .chunks()
                .filter(|(_, c)| c.is_resident() && c.host().is_none() && c.peer().is_none())
                .count();
            if !inner.tiers.host.short_of(without_copy) {
                return Ok(0);
            }
            (inner.tiers.host.slab_bytes(), std::sync::Arc::clone(&inner.tiers.device))
        };
        if !HostMemory::pinning_leaves_an_eighth(HostMemory::read(), bytes) {
            return Ok(0);
        }
        let pinned = match device.alloc_pinned_gently(bytes).during(call) {
            Ok(base) => base,
            Err(e) => {
                self.lock().tiers.host.stop_pinning_ahead();
                return Err(e);
            }
        };
        match self.lock().tiers.host.adopt_slab(pinned) {
            true => Ok(bytes),
            // The budget shrank meanwhile.
            false => device.free_pinned(pinned, bytes).during(call).map(|()| 0),
        }
    }
}

// Engines made outside a shuttle run (sync.rs): not in the model-checking build.
#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use crate::{AllocOptions, Engine, EngineConfig, Stats, Tier};
    use tiermem_mechanism::BackendChoice;

    const MIB: usize = 1 << 20;

    fn engine(evict_room: bool) -> Engine {
        let config = EngineConfig {
            backend: BackendChoice::Sim,
            hbm_limit: Some(64 * MIB),
            host_limit: Some(256 * MIB),
            chunk: Some(2 * MIB),
            sim_hbm: 64 * MIB,
            evict_room,
            ..EngineConfig::default()
        };
        Engine::new(config).expect("a simulated engine")
    }

    fn pinned(stats: &Stats) -> usize {
        stats.host_pinned_bytes
    }

    /// A buffer of `bytes` written with `byte`: every chunk resident, with no copy below.
    fn filled(engine: &Engine, bytes: usize, byte: u8) -> crate::BufferId {
        let (id, _) = engine.alloc(bytes, AllocOptions::default()).unwrap();
        engine.write(id, 0, &vec![byte; bytes]).unwrap();
        assert_eq!(engine.stats().tiers[Tier::Hbm].used_bytes, bytes, "written in HBM");
        id
    }

    #[test]
    fn room_is_pinned_for_what_hbm_holds_without_a_copy_and_a_cut_then_pins_nothing() {
        let engine = engine(true);
        let id = filled(&engine, 48 * MIB, 0x5a);
        assert_eq!(pinned(&engine.stats()), 0, "nothing pinned before it is asked for");
        let mut calls = 0;
        while engine.pin_room_to_evict().unwrap() > 0 {
            calls += 1;
            assert!(calls < 10, "pinning ahead must stop once there is room");
        }
        let ahead = pinned(&engine.stats());
        assert!(ahead >= 48 * MIB, "room for the 24 chunks without a copy: {ahead} bytes pinned");
        assert!(ahead <= 256 * MIB, "never beyond the host cap");
        // A budget of 16 MiB sends 32 MiB down into the room pinned ahead: nothing more is pinned.
        let ticket = engine.set_hbm_budget(16 * MIB).unwrap();
        engine.finish(ticket).unwrap();
        let stats = engine.stats();
        assert_eq!(pinned(&stats), ahead, "the cut found its room pinned");
        assert!(stats.tiers[Tier::Host].used_bytes >= 32 * MIB);
        let mut back = vec![0u8; 48 * MIB];
        engine.read(id, 0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0x5a), "every byte comes back");
    }

    #[test]
    fn off_or_within_a_host_budget_too_small_for_a_slab_nothing_is_pinned() {
        let off = engine(false);
        filled(&off, 32 * MIB, 1);
        assert_eq!(off.pin_room_to_evict().unwrap(), 0);
        assert_eq!(pinned(&off.stats()), 0);
        let on = engine(true);
        filled(&on, 32 * MIB, 2);
        on.set_host_budget(8 * MIB).unwrap();
        assert_eq!(on.pin_room_to_evict().unwrap(), 0, "a slab would exceed the host budget");
        assert_eq!(pinned(&on.stats()), 0);
    }
}
