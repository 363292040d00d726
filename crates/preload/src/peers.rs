//! Two GPUs in one process: each GPU's allocations opened to every other GPU of the process
//! that can reach them.
//!
//! A program using two GPUs copies between them (a model split across GPUs moves activations
//! with `tensor.to("cuda:1")`), and the driver refuses a copy or a kernel on one GPU touching
//! VMM memory that is not opened to it (`CUDA_ERROR_INVALID_VALUE`, seen on the H200 pair),
//! where `cuMemAlloc` memory is reachable from every peer. So when a second GPU opens, both
//! reach each other's allocations where the hardware allows (those made before included), and
//! every later opening — at allocation and after a move (remap.rs) — names them all.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use tiermem_mechanism::Device;

use crate::boundary::log;
use crate::process::Process;

/// Per GPU (ordinals below 64), the GPUs its allocations are opened to, as a bit mask: its own,
/// and every other GPU of the process that can reach its memory.
static ACCESS: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];

/// The GPUs that GPU `ordinal`'s allocations are opened to (its own first).
pub fn access_gpus(ordinal: usize) -> Vec<usize> {
    let mask = ACCESS.get(ordinal).map_or(0, |mask| mask.load(Relaxed));
    std::iter::once(ordinal).chain((0..64).filter(|&g| g != ordinal && mask & (1 << g) != 0)).collect()
}

/// GPU `ordinal` just opened in `p`: it and the GPUs opened before reach each other's
/// allocations where they can, those allocations made already included.
pub fn opened(p: &Process, call: &str, ordinal: usize, device: &dyn Device) {
    let Some(mine) = ACCESS.get(ordinal) else { return };
    for (&other, gpu) in p.gpus.iter().filter(|(&g, gpu)| g != ordinal && g < 64 && gpu.device.is_some()) {
        let theirs = gpu.device.as_ref().expect("filtered");
        if theirs.peer_access(ordinal) {
            mine.fetch_or(1 << other, Relaxed);
        }
        if device.peer_access(other) {
            ACCESS[other].fetch_or(1 << ordinal, Relaxed);
        }
    }
    for allocation in p.books.iter().filter(|a| a.ordinal != ordinal) {
        let gpus = access_gpus(allocation.ordinal);
        let Some(owner) = p.gpus.get(&allocation.ordinal).and_then(|gpu| gpu.device.as_ref()) else { continue };
        if gpus.contains(&ordinal) {
            if let Err(why) = owner.set_access_from(allocation.va, allocation.reserved, &gpus) {
                let what = format!("0x{:x} could not be opened to GPU {ordinal} ({why})", allocation.va);
                log(call, &what, &format!("kernels and copies on GPU {ordinal} cannot reach it"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_lists_itself_first_then_the_peers_that_reach_it() {
        ACCESS[62].fetch_or((1 << 3) | (1 << 63), Relaxed);
        assert_eq!(access_gpus(62), [62, 3, 63]);
        assert_eq!(access_gpus(61), [61], "alone: its own");
        assert_eq!(access_gpus(70), [70], "past the mask's GPUs: its own");
    }
}
