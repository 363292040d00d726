//! What a memory pool tiermem serves says of its memory (`cuMemPoolGetAttribute`), as the
//! driver's pool would say of its own.
//!
//! A pool answers four statistics (CUDA 11.3): the memory it holds (`RESERVED_MEM_CURRENT`),
//! the part of it allocated and not free for reuse (`USED_MEM_CURRENT`), and the highest each
//! reached since the program last reset them (`…_HIGH`, reset by `cuMemPoolSetAttribute` with
//! 0). PyTorch's `cudaMallocAsync` backend answers `torch.cuda.memory_allocated()`,
//! `memory_reserved()` and their peaks from them; CuPy's and RAPIDS' pools their own
//! statistics. The driver counts only its own memory, so a served pool's answers left tiermem's
//! out: zero for a program whose every stream-ordered allocation is tiermem's.
//!
//! So tiermem adds its own to the driver's: *used*, the bytes asked for by the live
//! stream-ordered allocations it serves on the pool's GPU; *reserved*, those and its frees kept
//! for reuse (deferred.rs), which hold memory until given back. tiermem's kept frees are the
//! GPU's, not one pool's: a GPU with several served pools (its default one and pools the
//! program created) answers the GPU's totals for each.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

/// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`, `…_HIGH`, `CU_MEMPOOL_ATTR_USED_MEM_CURRENT`, `…_HIGH`.
const RESERVED_CURRENT: c_int = 5;
const RESERVED_HIGH: c_int = 6;
const USED_CURRENT: c_int = 7;
const USED_HIGH: c_int = 8;

/// Per GPU (ordinals below 64): bytes used now, and the highest used and reserved since reset.
static USED: [AtomicUsize; 64] = [const { AtomicUsize::new(0) }; 64];
static USED_PEAK: [AtomicUsize; 64] = [const { AtomicUsize::new(0) }; 64];
static RESERVED_PEAK: [AtomicUsize; 64] = [const { AtomicUsize::new(0) }; 64];
/// The live stream-ordered allocations counted: pointer → (GPU, bytes).
static LIVE: Mutex<Option<HashMap<u64, (usize, usize)>>> = Mutex::new(None);

fn live() -> MutexGuard<'static, Option<HashMap<u64, (usize, usize)>>> {
    // A map of numbers: consistent after any panic.
    LIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Bytes tiermem's kept frees of GPU `ordinal` reserve.
fn kept(ordinal: usize) -> usize {
    crate::process::lock().books.kept_bytes(ordinal)
}

/// A stream-ordered allocation at `ptr` was served: counted if it is tiermem's (its GPU, the
/// bytes asked for and the GPU's kept frees read under one lock of the books).
pub fn allocated(ptr: u64) {
    let (ordinal, bytes, kept) = {
        let p = crate::process::lock();
        let Some(a) = p.books.containing(ptr).filter(|a| a.va == ptr) else { return };
        (a.ordinal, a.requested, p.books.kept_bytes(a.ordinal))
    };
    count(ptr, (ordinal, bytes), kept);
}

/// Counts `bytes` at `ptr` on GPU `ordinal` as used, beside `kept` bytes of kept frees.
fn count(ptr: u64, (ordinal, bytes): (usize, usize), kept: usize) {
    let Some(used) = USED.get(ordinal) else { return };
    live().get_or_insert_with(HashMap::new).insert(ptr, (ordinal, bytes));
    let now = used.fetch_add(bytes, Relaxed) + bytes;
    USED_PEAK[ordinal].fetch_max(now, Relaxed);
    RESERVED_PEAK[ordinal].fetch_max(now + kept, Relaxed);
}

/// The program freed `ptr` (kept for reuse, or not): counted no more if it was a counted one.
pub fn freed(ptr: u64) {
    let Some((ordinal, bytes)) = live().as_mut().and_then(|live| live.remove(&ptr)) else { return };
    if let Some(used) = USED.get(ordinal) {
        // Never below zero, whatever the order of two threads' frees and allocations.
        let _ = used.fetch_update(Relaxed, Relaxed, |now| Some(now.saturating_sub(bytes)));
    }
}

/// A device reset freed every allocation of GPU `ordinal` (reset.rs).
pub fn forget_gpu(ordinal: usize) {
    if let Some(live) = live().as_mut() {
        live.retain(|_, &mut (gpu, _)| gpu != ordinal);
    }
    for counter in [&USED, &USED_PEAK, &RESERVED_PEAK] {
        if let Some(value) = counter.get(ordinal) {
            value.store(0, Relaxed);
        }
    }
}

/// tiermem's part of `attribute` on GPU `ordinal`, if it is one of the four statistics.
fn ours(ordinal: usize, attribute: c_int) -> Option<u64> {
    let used = USED.get(ordinal)?.load(Relaxed);
    let value = match attribute {
        RESERVED_CURRENT => used + kept(ordinal),
        RESERVED_HIGH => RESERVED_PEAK[ordinal].load(Relaxed).max(used + kept(ordinal)),
        USED_CURRENT => used,
        USED_HIGH => USED_PEAK[ordinal].load(Relaxed).max(used),
        _ => return None,
    };
    Some(value as u64)
}

/// The driver answered `attribute` of a pool tiermem serves on GPU `ordinal` into `value`:
/// tiermem's part added.
///
/// # Safety
/// `value` valid for the attribute's type: a `cuuint64_t` for the four statistics.
pub unsafe fn add_ours(ordinal: usize, attribute: c_int, value: *mut c_void) {
    let Some(mine) = ours(ordinal, attribute) else { return };
    if value.is_null() {
        return;
    }
    let value = value.cast::<u64>();
    // SAFETY: the caller's contract: a cuuint64_t the driver just wrote.
    unsafe { *value = (*value).saturating_add(mine) };
}

/// The program resets `attribute` of a pool tiermem serves on GPU `ordinal` (a high-water
/// mark, set to 0: it starts again from the current value, as the driver's does).
pub fn reset(ordinal: usize, attribute: c_int) {
    let Some(used) = USED.get(ordinal).map(|used| used.load(Relaxed)) else { return };
    match attribute {
        USED_HIGH => USED_PEAK[ordinal].store(used, Relaxed),
        RESERVED_HIGH => RESERVED_PEAK[ordinal].store(used + kept(ordinal), Relaxed),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn used_and_its_peak_follow_allocations_and_frees_and_reset_to_the_current_value() {
        const GPU: usize = 61;
        count(0xa000, (GPU, 10), 0);
        count(0xb000, (GPU, 5), 0);
        freed(0xa000);
        assert_eq!((ours(GPU, USED_CURRENT), ours(GPU, USED_HIGH)), (Some(5), Some(15)));
        freed(0xa000);
        freed(0xc000);
        assert_eq!(ours(GPU, USED_CURRENT), Some(5), "a second free, or one never counted, changes nothing");
        forget_gpu(GPU);
        assert_eq!(ours(GPU, USED_CURRENT), Some(0), "a reset frees everything");
        freed(0xb000);
        assert_eq!(ours(GPU, USED_CURRENT), Some(0), "and forgets it");
        reset(GPU, USED_HIGH);
        assert_eq!(ours(GPU, USED_HIGH), Some(0));
        assert_eq!(ours(GPU, 4), None, "not a statistic: the release threshold is the driver's alone");
        assert_eq!(ours(64, USED_CURRENT), None, "no such GPU");
    }
}
