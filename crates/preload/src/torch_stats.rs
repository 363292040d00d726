//! PyTorch's memory statistics for the PyTorch route (torch_alloc.rs): a
//! `CUDAPluggableAllocator` has none (`torch.cuda.memory_stats()`, `max_memory_allocated()`,
//! `reset_peak_memory_stats()` raise "does not yet support getDeviceStats"), and programs call
//! them everywhere — Hugging Face, training loops logging their peak, benchmarks sizing their
//! batches. The hook (crates/cli/src/torch_hook.py) answers them from these counters instead,
//! kept per GPU as PyTorch's caching allocator keeps its own: bytes of live tensors (now, peak,
//! in all, freed), the number of allocations and frees, and the bytes held for them — the live
//! tensors and what CUDA graphs keep (torch_alloc.rs) — now and at the peak.
//!
//! Atomics only: malloc and free count without a lock, from any thread.

use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// One GPU's counters.
#[derive(Default)]
struct Counters {
    current: AtomicU64,
    peak: AtomicU64,
    allocated: AtomicU64,
    freed: AtomicU64,
    allocations: AtomicU64,
    frees: AtomicU64,
    /// Bytes of tensors freed while kept for CUDA graphs (torch_alloc.rs).
    kept: AtomicU64,
    reserved_peak: AtomicU64,
}

const GPUS: usize = 64;
static COUNTERS: [Counters; GPUS] = [const {
    Counters {
        current: AtomicU64::new(0),
        peak: AtomicU64::new(0),
        allocated: AtomicU64::new(0),
        freed: AtomicU64::new(0),
        allocations: AtomicU64::new(0),
        frees: AtomicU64::new(0),
        kept: AtomicU64::new(0),
        reserved_peak: AtomicU64::new(0),
    }
}; GPUS];

fn of(device: c_int) -> Option<&'static Counters> {
    COUNTERS.get(usize::try_from(device).ok()?)
}

/// A tensor of `bytes` served on GPU `device`.
pub fn allocated(device: c_int, bytes: u64) {
    let Some(c) = of(device) else { return };
    let now = c.current.fetch_add(bytes, Relaxed) + bytes;
    c.peak.fetch_max(now, Relaxed);
    c.reserved_peak.fetch_max(now + c.kept.load(Relaxed), Relaxed);
    c.allocated.fetch_add(bytes, Relaxed);
    c.allocations.fetch_add(1, Relaxed);
}

/// A tensor of `bytes` on GPU `device` freed; `kept`: its memory stays held (a CUDA graph's).
pub fn freed(device: c_int, bytes: u64, kept: bool) {
    let Some(c) = of(device) else { return };
    // Saturating: a free PyTorch reports with another size than it asked for counts no less than 0.
    let _ = c.current.fetch_update(Relaxed, Relaxed, |now| Some(now.saturating_sub(bytes)));
    if kept {
        c.kept.fetch_add(bytes, Relaxed);
    }
    c.freed.fetch_add(bytes, Relaxed);
    c.frees.fetch_add(1, Relaxed);
}

/// Writes GPU `device`'s counters into `out`, at most `len` of them, in this order (the hook
/// reads them so): bytes of live tensors now, at their peak, allocated in all, freed in all;
/// allocations, frees; bytes held now, at their peak; bytes kept for CUDA graphs. How many, or
/// -1 for a device out of range or a null `out`.
///
/// # Safety
/// `out` null or valid for `len` writes of `u64`.
#[no_mangle]
pub unsafe extern "C" fn tiermem_torch_memory_stats(device: c_int, out: *mut u64, len: usize) -> c_int {
    let Some(c) = of(device).filter(|_| !out.is_null()) else { return -1 };
    let current = c.current.load(Relaxed);
    let kept = c.kept.load(Relaxed);
    let values = [
        current,
        c.peak.load(Relaxed),
        c.allocated.load(Relaxed),
        c.freed.load(Relaxed),
        c.allocations.load(Relaxed),
        c.frees.load(Relaxed),
        current + kept,
        c.reserved_peak.load(Relaxed).max(current + kept),
        kept,
    ];
    let n = len.min(values.len());
    // SAFETY: the caller's buffer, valid for `len` >= `n` writes.
    unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), out, n) };
    n as c_int
}

/// `torch.cuda.reset_peak_memory_stats(device)`: the peaks are the current values from now on;
/// 0, or -1 for a device out of range.
#[no_mangle]
pub extern "C" fn tiermem_torch_reset_peak(device: c_int) -> c_int {
    let Some(c) = of(device) else { return -1 };
    let current = c.current.load(Relaxed);
    c.peak.store(current, Relaxed);
    c.reserved_peak.store(current + c.kept.load(Relaxed), Relaxed);
    0
}

/// `torch.cuda.reset_accumulated_memory_stats(device)`: the totals and counts start again from
/// nothing; 0, or -1 for a device out of range.
#[no_mangle]
pub extern "C" fn tiermem_torch_reset_accumulated(device: c_int) -> c_int {
    let Some(c) = of(device) else { return -1 };
    for total in [&c.allocated, &c.freed, &c.allocations, &c.frees] {
        total.store(0, Relaxed);
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(device: c_int) -> [u64; 9] {
        let mut out = [0u64; 9];
        // SAFETY: a buffer of nine.
        assert_eq!(unsafe { tiermem_torch_memory_stats(device, out.as_mut_ptr(), 9) }, 9);
        out
    }

    #[test]
    fn counts_live_tensors_their_peak_and_what_graphs_keep() {
        let gpu = 63; // a GPU of its own: tests run in parallel
        allocated(gpu, 100);
        allocated(gpu, 50);
        freed(gpu, 100, false);
        assert_eq!(read(gpu), [50, 150, 150, 100, 2, 1, 50, 150, 0]);
        freed(gpu, 50, true);
        assert_eq!(read(gpu)[..2], [0, 150]);
        assert_eq!(read(gpu)[6..], [50, 150, 50], "a graph keeps 50 held");
        assert_eq!(tiermem_torch_reset_peak(gpu), 0);
        assert_eq!(tiermem_torch_reset_accumulated(gpu), 0);
        assert_eq!(read(gpu), [0, 0, 0, 0, 0, 0, 50, 50, 50]);
        assert_eq!(tiermem_torch_reset_peak(-1), -1);
        // SAFETY: a null buffer is refused, not written.
        assert_eq!(unsafe { tiermem_torch_memory_stats(0, std::ptr::null_mut(), 9) }, -1);
        let mut two = [0u64; 2];
        // SAFETY: a buffer of two.
        assert_eq!(unsafe { tiermem_torch_memory_stats(gpu, two.as_mut_ptr(), 2) }, 2);
    }
}
