//! `cudaDeviceReset` (`cuDevicePrimaryCtxReset`): the driver destroys the GPU's primary context
//! and frees every allocation made in it. Tiermem's allocations are not the context's: their
//! address ranges and physical chunks are the VMM API's, which outlive contexts (on the H200 a
//! buffer never freed before a reset was still held, and counted, after it). The streams and
//! events tiermem made in the context do not outlive it.
//!
//! So before passing a reset on, tiermem does what the reset does to the driver's memory: it
//! frees every allocation of that GPU (the program's live ones, those kept for CUDA graphs —
//! the reset destroys the graphs — and those kept mapped for reuse, deferred.rs), forgets the
//! small ones the driver made and tiermem counted (the reset frees those itself), and closes
//! the GPU — its streams, its events, its retain of the context. The next allocation or memory
//! query opens it again, in the new context, with the budget it had.
//! CUDA's samples end with a reset, and some programs reset between phases: after one, the
//! program finds the whole budget free, as it would find the GPU.

use std::collections::BTreeMap;
use std::ffi::c_int;
use std::sync::Mutex;

use crate::boundary::{guard_step, inside, to_driver, CuResult};
use crate::process::{self, Drain};
use crate::wrappers::wrappers;

/// What a GPU closed by a reset keeps until it is opened again.
#[derive(Debug, Clone, Copy)]
pub struct Kept {
    pub budget: usize,
    pub limit: usize,
    /// HBM still counted: the program's own `cuMemCreate` chunks (vmm.rs), which outlive the
    /// context as tiermem's do.
    pub hbm_used: usize,
}

static KEPT: Mutex<BTreeMap<usize, Kept>> = Mutex::new(BTreeMap::new());

fn kept() -> std::sync::MutexGuard<'static, BTreeMap<usize, Kept>> {
    KEPT.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What GPU `ordinal` kept when a reset closed it, taken (process.rs opens it again with it).
pub fn kept_through_reset(ordinal: usize) -> Option<Kept> {
    kept().remove(&ordinal)
}

/// A reset of GPU `device`'s primary context: tiermem lets go of the GPU first (module
/// documentation), then the driver resets it.
fn primary_context_reset(name: &'static str, call: impl FnOnce() -> CuResult, device: c_int) -> CuResult {
    if !inside() {
        if let Ok(ordinal) = usize::try_from(device) {
            guard_step(name, || {
                let_go(name, ordinal);
            });
        }
    }
    to_driver(call)
}

/// Frees what tiermem holds on GPU `ordinal` as a reset frees the driver's memory, and closes
/// the GPU. Nothing if tiermem never opened it.
fn let_go(call: &str, ordinal: usize) {
    if process::lock().gpus.get(&ordinal).is_none_or(|gpu| gpu.device.is_none()) {
        return;
    }
    crate::deferred::reap(true);
    crate::deferred::trim(call, |gpu| if gpu == ordinal { 0 } else { usize::MAX });
    crate::pool_stats::forget_gpu(ordinal);
    let live: Vec<u64> = process::lock().books.iter().filter(|a| a.ordinal == ordinal).map(|a| a.va).collect();
    for ptr in live {
        // Not an error the program would see: the reset frees its memory whatever happens.
        let _ = process::free(call, ptr, Drain::Context);
        // Kept for a graph (captures.rs): the reset destroys the graphs too.
        let _ = crate::captures::forget(ptr);
    }
    let closed = {
        let mut p = process::lock();
        let small = p.books.take_small_of(ordinal);
        let closed = p.gpus.remove(&ordinal);
        if let Some(gpu) = &closed {
            // Every allocation of tiermem's is torn down by now (its HBM given back); the
            // driver's small ones the reset frees itself.
            let hbm_used = gpu.hbm_used.saturating_sub(small);
            kept().insert(ordinal, Kept { budget: gpu.budget, limit: gpu.limit, hbm_used });
        }
        closed
    };
    // The device (its streams, events and retain of the context) goes while the context lives,
    // and outside the lock: dropping it calls the driver.
    drop(closed);
}

wrappers! { reset_routes:
    cuDevicePrimaryCtxReset(device: c_int) => primary_context_reset(device);
    cuDevicePrimaryCtxReset_v2(device: c_int) => primary_context_reset(device);
}
