//! Stream-ordered allocations while a CUDA-graph capture is under way (issue 16: "a program that
//! uses CUDA graphs: captured launches referencing tiermem memory must stay correct").
//!
//! tiermem serves `cuMemAllocAsync` / `cuMemFreeAsync` in stream order with events (deferred.rs):
//! a free records an event on its stream, and a later allocation reuses the memory once that
//! event is done. On a capturing stream none of that holds — an event recorded there is a node
//! of the graph, querying it ends the capture (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`), and
//! the graph's replays, later and any number of times, reuse every address its capture touched.
//! PyTorch's caching allocator keeps a private pool per graph for this; a pluggable allocator
//! (torch_alloc.rs) or a program's own stream-ordered allocations get plain calls.
//!
//! So while a capture is under way anywhere in the process (gate.rs counts them):
//! * an allocation is served without stream ordering ([`alloc`]: tiermem's allocation, or the
//!   driver's plain `cuMemAlloc` for what tiermem leaves to the driver — never a graph memory
//!   node, whose replays would need the program to free it first), with the thread's capture
//!   mode relaxed for the call, as PyTorch's own allocator does around `cudaMalloc`, so that
//!   creating and mapping chunks does not end another thread's capture in global mode;
//! * a pointer made during a capture, or freed during one (tiermem's or the driver's: a free
//!   captured into the graph would free it again at every replay), is never freed nor reused
//!   ([`keeps`]): it stays the graph's for the process's life — nobody tells tiermem when
//!   a graph is destroyed — mapped at its address, moved at quiesce points like any chunk.
//!
//! A program that captures graph after graph grows by each one's allocations; the `--stats`
//! line says how much was kept.

use std::collections::HashSet;
use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

use crate::boundary::{CuResult, CUDA_SUCCESS};

/// Pointers made while a capture was under way and not freed yet, and how many (every free
/// asks [`keeps`]: outside captures, with one atomic read).
static CAPTURED: Mutex<Option<HashSet<u64>>> = Mutex::new(None);
static CAPTURED_LIVE: AtomicUsize = AtomicUsize::new(0);
/// Allocations kept for graphs, and their bytes where known (tiermem's).
static KEPT: AtomicU64 = AtomicU64::new(0);
static KEPT_BYTES: AtomicU64 = AtomicU64::new(0);

fn captured() -> std::sync::MutexGuard<'static, Option<HashSet<u64>>> {
    // A set of addresses: consistent after any panic.
    CAPTURED.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Serves a stream-ordered allocation of `size` bytes into `*dptr` during a capture: tiermem's
/// allocation without stream ordering, else the driver's plain `cuMemAlloc`; the pointer is the
/// graph's.
///
/// # Safety
/// `dptr` null or valid for a write.
pub unsafe fn alloc(call: &str, dptr: *mut u64, size: usize) -> CuResult {
    let _relaxed = RelaxedCapture::new();
    let plain = || match crate::driver::driver().and_then(|d| d.mem_alloc) {
        // SAFETY: the driver's cuMemAlloc_v2 with the caller's out-pointer.
        Some(mem_alloc) => unsafe { mem_alloc(dptr, size) },
        None => crate::boundary::CUDA_ERROR_NOT_INITIALIZED,
    };
    // SAFETY: the caller's out-pointer.
    let code = unsafe { crate::entry::alloc_or(call, dptr, (size, None), plain) };
    if code == CUDA_SUCCESS && !dptr.is_null() {
        // SAFETY: written on success.
        let ptr = unsafe { *dptr };
        if captured().get_or_insert_with(HashSet::new).insert(ptr) {
            CAPTURED_LIVE.fetch_add(1, Relaxed);
        }
    }
    code
}

/// Whether the free of `ptr` must be skipped, its memory kept for a graph: it was made during
/// a capture, or a capture is under way.
pub fn keeps(ptr: u64) -> bool {
    let kept = forget(ptr) || crate::gate::capturing();
    if kept {
        KEPT.fetch_add(1, Relaxed);
        let bytes = crate::process::allocation_bytes(ptr).unwrap_or(0);
        KEPT_BYTES.fetch_add(bytes as u64, Relaxed);
        crate::trace::event("kept_for_graph", || format!("\"ptr\": {ptr}"));
    }
    kept
}

/// Forgets `ptr` as made during a capture (freed, or a device reset freed it and the graphs
/// with it); whether it was.
pub fn forget(ptr: u64) -> bool {
    let was = CAPTURED_LIVE.load(Relaxed) > 0 && captured().as_mut().is_some_and(|set| set.remove(&ptr));
    if was {
        CAPTURED_LIVE.fetch_sub(1, Relaxed);
    }
    was
}

/// The `--stats` line, if anything was kept for graphs.
pub fn report() -> Option<String> {
    let kept = KEPT.load(Relaxed);
    (kept > 0).then(|| {
        format!(
            "tiermem: stats: {kept} allocation(s) made or freed during CUDA-graph captures kept for the graphs ({} of them tiermem's)",
            tiermem::format_size(KEPT_BYTES.load(Relaxed) as usize)
        )
    })
}

/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
const CAPTURE_MODE_RELAXED: c_int = 2;
type ExchangeModeFn = unsafe extern "C" fn(*mut c_int) -> CuResult;

/// The calling thread's stream-capture mode made relaxed until dropped, then put back.
struct RelaxedCapture(Option<(ExchangeModeFn, c_int)>);

impl RelaxedCapture {
    fn new() -> RelaxedCapture {
        static EXCHANGE: OnceLock<Option<ExchangeModeFn>> = OnceLock::new();
        let found = crate::wrappers::cached_entry(&EXCHANGE, "cuThreadExchangeStreamCaptureMode\0");
        let Some(exchange) = found else { return RelaxedCapture(None) };
        let mut mode = CAPTURE_MODE_RELAXED;
        // SAFETY: a valid pointer to the mode to set; the previous one is written back there.
        match unsafe { exchange(&mut mode) } {
            CUDA_SUCCESS => RelaxedCapture(Some((exchange, mode))),
            _ => RelaxedCapture(None),
        }
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        if let Some((exchange, mut before)) = self.0 {
            // SAFETY: as in new(): the mode the thread had is put back.
            unsafe { exchange(&mut before) };
        }
    }
}
