//! Spare host chunks made ahead of a budget cut, for a program the node daemon leases
//! (`TIERMEM_SPARES_AHEAD=on`; off by default: on the H200 the cut's steps were ~0.5 s
//! shorter and the steps at the smaller budget after it slower, BENCHMARKS.md, fortieth session).
//!
//! A cut sends chunks from HBM to the host, each into a host chunk: a spare one (left by an
//! earlier move up) or one made then — ~7–10 ms per 32 MiB on the H200 machines, pinned by the
//! driver, and its shadow opened, ~0.4 ms (shadows.rs) — after the program's kernels have
//! drained. A program that fit its budget until the cut has no spares, so it pays that for
//! every chunk it sends down, while its steps wait (BENCHMARKS.md, thirty-fifth and
//! thirty-ninth sessions: a leased training loop cut by 6 GiB took steps of 5–13 s).
//!
//! With this on, the daemon link's own thread (`Tenant::ready_for_cuts`: from two seconds
//! after registering, once a second) makes up to [`SLAB`] of host chunks at a time, each with
//! its shadow, while the spares fall short of what HBM holds (what a cut to nothing would send
//! down), and only while the host keeps an eighth of its memory available after them: pinned
//! memory cannot be swapped out (the engine's room to evict into follows the same rule). The
//! chunks are made with no lock held and handed to the moves' spares (rounds.rs) afterwards;
//! spares are given back as before — those beyond the HBM in use after a round of moves, all
//! of them at the GPU's last free.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use tiermem_mechanism::{ChunkLocation, Device, HostMemory, PhysHandle};

use crate::process;

/// The most made at each turn.
pub const SLAB: usize = 1 << 30;

/// Whether spares are made ahead (`TIERMEM_SPARES_AHEAD`, off by default).
fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| crate::boundary::switch("TIERMEM_SPARES_AHEAD", false) && crate::migrate::enabled())
}

static MADE: AtomicU64 = AtomicU64::new(0);
static MADE_BYTES: AtomicU64 = AtomicU64::new(0);
static NANOS: AtomicU64 = AtomicU64::new(0);

/// One turn for GPU `ordinal` (module documentation): the bytes of host chunks made.
pub fn make_ahead(ordinal: usize) -> usize {
    if !enabled() {
        return 0;
    }
    // This thread is tiermem's own: its driver calls reach the driver, not the wrappers.
    let _inside = crate::boundary::enter();
    let Some((device, chunk, hbm_used)) = ({
        let p = process::lock();
        p.gpus.get(&ordinal).and_then(|gpu| Some((gpu.device.clone()?, gpu.chunk, gpu.hbm_used)))
    }) else {
        return 0;
    };
    let Some(spare) = crate::migrate::with_tools(ordinal, |tools, _| tools.spare_bytes()) else { return 0 };
    let count = hbm_used.saturating_sub(spare).min(SLAB) / chunk.max(1);
    if count == 0 || !HostMemory::pinning_leaves_an_eighth(HostMemory::read(), count * chunk) {
        return 0;
    }
    let started = std::time::Instant::now();
    let made = make(device.as_ref(), chunk, count);
    let handed = crate::migrate::with_tools(ordinal, |tools, p| {
        for &handle in &made {
            tools.add_spare(chunk, handle);
        }
        // Shadows are the process's books: opened while nothing else moves or allocates.
        for &handle in &made {
            let _ = p.shadows.of(device.as_ref(), handle, chunk);
        }
    });
    if handed.is_none() {
        // A migration holds the spares, or the GPU's last allocation went meanwhile.
        release(&device, &made);
        return 0;
    }
    NANOS.fetch_add(started.elapsed().as_nanos() as u64, Relaxed);
    MADE.fetch_add(made.len() as u64, Relaxed);
    MADE_BYTES.fetch_add((made.len() * chunk) as u64, Relaxed);
    made.len() * chunk
}

/// Up to `count` host chunks of `chunk` bytes (fewer if the driver refuses one).
fn make(device: &dyn Device, chunk: usize, count: usize) -> Vec<PhysHandle> {
    let granules = chunk / device.info().granularity.max(1);
    (0..count).map_while(|_| crate::ipc::create_chunk(device, ChunkLocation::Host, granules).ok()).collect()
}

fn release(device: &Arc<dyn Device>, handles: &[PhysHandle]) {
    for &handle in handles {
        let _ = crate::spill::release(device.as_ref(), handle);
    }
}

/// The `--stats` line, if any were made.
pub fn report() -> Option<String> {
    let made = MADE.load(Relaxed);
    (made > 0).then(|| {
        format!(
            "tiermem: stats: spares ahead of cuts: {made} host chunks made ({}) in {:.1} ms",
            tiermem::format_size(MADE_BYTES.load(Relaxed) as usize),
            NANOS.load(Relaxed) as f64 / 1e6
        )
    })
}
