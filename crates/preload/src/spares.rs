//! Spare host chunks made ahead of a budget cut, for a program the node daemon leases:
//! by default ahead of a turn's end (`TIERMEM_SPARES_AHEAD=turns`), or ahead of any cut (`on`),
//! or never (`off`).
//!
//! A cut sends chunks from HBM to the host, each into a host chunk: a spare one (left by an
//! earlier move up) or one made then — ~7–21 ms per 32 MiB on the H200 machines, pinned by the
//! driver, and its shadow opened, ~0.4 ms (shadows.rs) — after the program's kernels have
//! drained. A program that fit its budget until the cut has no spares, so it pays that for
//! every chunk it sends down, while its steps wait (BENCHMARKS.md, thirty-fifth and
//! thirty-ninth sessions: a leased training loop cut by 6 GiB took steps of 5–13 s).
//!
//! Ahead of any cut (`on`), from two seconds after registering and once a second, the daemon
//! link's own thread (`Tenant::ready_for_cuts`) makes up to [`SLAB`] of host chunks at a time,
//! each with its shadow, while the spares fall short of what HBM holds (what a cut to nothing
//! would send down). A cut may never come, and measured on the H200 the steps at the smaller
//! budget after one were slower with them (BENCHMARKS.md, fortieth session): not the default.
//!
//! Ahead of a turn's end (`turns`, the default): with the daemon's working sets in turns, a
//! program in a turn that runs out is told that another waits for the GPU (`others_wait`,
//! the daemon's turns.rs, "Handing over"): its turn will end in a cut to its keep, its whole
//! working set sent down while neither program runs — ~10 s for 16 GiB made then on the H200
//! (forty-second session). So while it is told that (from half its turn on), the link's
//! thread makes slab after slab until the spares match what HBM holds, during the turn.
//!
//! Either way only while the host keeps an eighth of its memory available after them: pinned
//! memory cannot be swapped out (the engine's room to evict into follows the same rule). The
//! chunks are made with no lock held and handed to the moves' spares (rounds.rs) afterwards;
//! spares are given back as before — those beyond the HBM in use after a round of moves, all
//! of them at the GPU's last free.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use tiermem_mechanism::{ChunkLocation, Device, HostMemory, PhysHandle};

use crate::gpu_flags::GpuFlags;
use crate::process;

/// The most made at each turn.
pub const SLAB: usize = 1 << 30;

/// When spares are made ahead (`TIERMEM_SPARES_AHEAD`; module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ahead {
    Never,
    OfTurnsEnd,
    OfAnyCut,
}

fn ahead() -> Ahead {
    static MODE: std::sync::OnceLock<Ahead> = std::sync::OnceLock::new();
    *MODE.get_or_init(|| {
        const NAME: &str = "TIERMEM_SPARES_AHEAD";
        let mode = match std::env::var(NAME).as_deref() {
            Err(_) | Ok("turns") => Ahead::OfTurnsEnd,
            Ok("on" | "1" | "true") => Ahead::OfAnyCut,
            Ok("off" | "0" | "false") => Ahead::Never,
            Ok(other) => {
                crate::boundary::log(NAME, &format!("{other:?} is none of turns, on, off"), "taken as turns");
                Ahead::OfTurnsEnd
            }
        };
        if crate::migrate::enabled() {
            mode
        } else {
            Ahead::Never
        }
    })
}

/// GPUs (ordinals below 64) whose tenant is told that others wait for its turn to end.
static OTHERS_WAIT: GpuFlags = GpuFlags::new();

/// GPU `ordinal`'s tenant is told that others wait for its turn (`true`), or no longer.
pub fn others_wait(ordinal: usize, others_wait: bool) {
    OTHERS_WAIT.set(ordinal, others_wait);
    crate::trace::event("others_wait", || format!("\"gpu\": {ordinal}, \"others_wait\": {others_wait}"));
}

static MADE: AtomicU64 = AtomicU64::new(0);
static MADE_BYTES: AtomicU64 = AtomicU64::new(0);
static NANOS: AtomicU64 = AtomicU64::new(0);

/// One turn of the link's readying thread for GPU `ordinal` (module documentation): the bytes
/// of host chunks made.
pub fn make_ahead(ordinal: usize) -> usize {
    let mut made = 0;
    loop {
        let slab = match ahead() {
            Ahead::Never => 0,
            Ahead::OfTurnsEnd if !OTHERS_WAIT.is_set(ordinal) => 0,
            // Slab after slab while the turn's end is coming, looking again between slabs.
            Ahead::OfTurnsEnd => make_slab(ordinal),
            Ahead::OfAnyCut => return make_slab(ordinal),
        };
        if slab == 0 {
            return made;
        }
        made += slab;
    }
}

/// Up to [`SLAB`] of host chunks for GPU `ordinal`, while its spares fall short of what HBM
/// holds and the host keeps an eighth available: the bytes made.
fn make_slab(ordinal: usize) -> usize {
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
