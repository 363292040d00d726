//! Hotness from CUDA graph replays (issue 16: "hotness comes from launch arguments").
//!
//! A graph's kernels never pass through `cuLaunchKernel` when it is replayed: their arguments
//! were fixed when it was captured. So tiermem keeps, per executable graph, the pointers its
//! captured launches passed (one per launch that passed each), and a replay (`cuGraphLaunch`,
//! launch.rs) counts them for stage 2's hotness as launches count theirs — the quiesce points
//! and pauses where no stage-3 cycle is followed, or where the cycle followed has nothing to
//! move (migrate.rs; the cycle's own chunks then stay where they are), move a graph's chunks by
//! how much its kernels use them (its activations, passed to many of them, before its weights,
//! each passed to one). A replay also gets the pause of a program that has not synchronized for
//! a while. A captured launch itself counts for nothing when it is captured: its kernel runs
//! only in the replays (nor is it a launch of stage 3's cycle, which would plan for it).
//!
//! Stage 3 does not see replays. Tried on the H200 (BENCHMARKS.md, thirty-eighth session): with
//! a replay as one launch of the cycle, its chunks held by heat where they exceed the budget, a
//! decoder graph replayed after eager layers of its own moved ~1 GiB each way every step (the
//! eager layers' chunks and the graph's taking HBM from each other) and ran at 31 ms a step at
//! 0.7x its peak against 13 ms without — a launch that reads a weight once reads it over PCIe
//! as fast as a move would bring it, and the move costs the way back too. A compiled model's
//! graphs ran 15–30% slower the same way. So stage 3 plans by the eager launches around
//! replays, as before.
//!
//! Recording: while a capture is under way, each launch's arguments are scanned, and when its
//! stream is being captured (`cuStreamGetCaptureInfo`, which knows the streams joined to a
//! capture through events too) they are kept under the capture's id. `cuStreamEndCapture` makes
//! them the graph's (added to what it had, for a capture into an existing graph), each
//! instantiation the executable graph's; `cuGraphExecDestroy` and `cuGraphDestroy` forget them.
//! Graphs built node by node (`cuGraphAddKernelNode`), updated (`cuGraphExecUpdate`), cloned or
//! nested are not followed: their replays carry no hotness, as before. Bounded: a graph keeps
//! each distinct pointer once and repeats of the most passed ones up to [`MAX_WORDS`].
//!
//! Locking: one mutex over the books below, never held while calling the driver.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::boundary::{to_driver, CuResult, CUDA_SUCCESS};
use crate::driver::Stream;
use crate::wrappers::cached_entry;

/// Pointers kept per graph at most (a replay counts them all, under the hotness lock).
pub const MAX_WORDS: usize = 4096;
/// Pointers kept per capture under way at most, before [`compact`] bounds them per graph.
const MAX_CAPTURED: usize = 1 << 20;
/// `CU_STREAM_CAPTURE_STATUS_ACTIVE`.
const CAPTURE_ACTIVE: c_int = 1;
/// `CU_STREAM_PER_THREAD`: the per-thread default stream, named explicitly.
const PER_THREAD_STREAM: usize = 2;

type CaptureInfoFn = unsafe extern "C" fn(Stream, *mut c_int, *mut u64) -> CuResult;

#[derive(Default)]
struct Books {
    /// Capture id → the pointers its launches passed, one per launch that passed each.
    captures: HashMap<u64, Vec<u64>>,
    graphs: HashMap<usize, Arc<[u64]>>,
    execs: HashMap<usize, Arc<[u64]>>,
}

static BOOKS: Mutex<Option<Books>> = Mutex::new(None);

fn books() -> MutexGuard<'static, Option<Books>> {
    // Maps of pointers: consistent after any panic.
    BOOKS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The id of the capture `stream` is part of, if any: the driver's `cuStreamGetCaptureInfo`
/// (its first form, which every driver since CUDA 10.1 exports), the per-thread flavour for a
/// call that came through a `_ptsz` entry point.
pub fn capture_of(stream: Stream, per_thread: bool) -> Option<u64> {
    static PLAIN: OnceLock<Option<CaptureInfoFn>> = OnceLock::new();
    static PER_THREAD: OnceLock<Option<CaptureInfoFn>> = OnceLock::new();
    let info = match per_thread {
        true => cached_entry(&PER_THREAD, "cuStreamGetCaptureInfo_ptsz\0"),
        false => cached_entry(&PLAIN, "cuStreamGetCaptureInfo\0"),
    }?;
    // A null stream from a per-thread entry point is the per-thread default stream.
    let stream = match (per_thread, stream.is_null()) {
        (true, true) => PER_THREAD_STREAM as Stream,
        _ => stream,
    };
    let (mut status, mut id) = (0, 0u64);
    // SAFETY: the driver's function with valid out-pointers; it validates the stream.
    let code = to_driver(|| unsafe { info(stream, &mut status, &mut id) });
    (code == CUDA_SUCCESS && status == CAPTURE_ACTIVE).then_some(id)
}

/// A launch on `stream` passed the candidate pointers `words` while a capture was under way:
/// kept for the graph its capture makes, if the stream is being captured. Whether it was (the
/// kernel then runs only when the graph is replayed).
pub fn launched(stream: Stream, per_thread: bool, words: &[u64]) -> bool {
    let Some(id) = capture_of(stream, per_thread) else { return false };
    if words.is_empty() {
        return true;
    }
    let mut books = books();
    let kept = books.get_or_insert_with(Books::default).captures.entry(id).or_default();
    let room = MAX_CAPTURED.saturating_sub(kept.len());
    kept.extend(words.iter().take(room));
    true
}

/// The capture `id` ended: made `graph` (`Some`), or failed (`None`: its pointers forgotten).
pub fn capture_ended(id: u64, graph: Option<*mut c_void>) {
    let mut books = books();
    let books = books.get_or_insert_with(Books::default);
    let Some(words) = books.captures.remove(&id) else { return };
    if let Some(graph) = graph {
        let mut all = books.graphs.get(&(graph as usize)).map(|w| w.to_vec()).unwrap_or_default();
        all.extend(words);
        let all = compact(all);
        let count = all.len();
        crate::trace::event("graph", || format!("\"graph\": {}, \"pointers\": {count}", graph as usize));
        books.graphs.insert(graph as usize, all.into());
        CAPTURED.fetch_add(1, Relaxed);
    }
}

/// `exec` was instantiated from `graph`.
pub fn instantiated(exec: *mut c_void, graph: *mut c_void) {
    let mut books = books();
    let books = books.get_or_insert_with(Books::default);
    let known = books.graphs.get(&(graph as usize)).map_or("null".to_owned(), |words| words.len().to_string());
    crate::trace::event("instantiated", || format!("\"exec\": {}, \"pointers\": {known}", exec as usize));
    match books.graphs.get(&(graph as usize)).cloned() {
        Some(words) => books.execs.insert(exec as usize, words),
        // A handle the driver reuses for a graph not followed: no stale pointers.
        None => books.execs.remove(&(exec as usize)),
    };
}

/// The program destroys executable graph `exec`.
pub fn exec_destroyed(exec: *mut c_void) {
    if let Some(books) = books().as_mut() {
        books.execs.remove(&(exec as usize));
    }
}

/// The program destroys graph `graph`.
pub fn graph_destroyed(graph: *mut c_void) {
    if let Some(books) = books().as_mut() {
        books.graphs.remove(&(graph as usize));
    }
}

/// The pointers a replay of `exec` passes (module documentation), if its capture was followed.
pub fn words_of(exec: *mut c_void) -> Option<Arc<[u64]>> {
    books().as_ref()?.execs.get(&(exec as usize)).cloned()
}

/// What `--stats` says of graphs: captures followed (their pointers kept), replays, those
/// counted for hotness, and those of graphs not followed (built node by node, updated…).
static CAPTURED: AtomicU64 = AtomicU64::new(0);
static REPLAYS: AtomicU64 = AtomicU64::new(0);
static HEATED: AtomicU64 = AtomicU64::new(0);
static NOT_FOLLOWED: AtomicU64 = AtomicU64::new(0);

/// A replay of `exec` (launch.rs): counted, and, if `scanned` (chunks are on the host), its
/// pointers for hotness — `None` for a graph whose capture was not followed.
pub fn replayed(exec: *mut c_void, scanned: bool) -> Option<Arc<[u64]>> {
    REPLAYS.fetch_add(1, Relaxed);
    if !scanned {
        return None;
    }
    let words = words_of(exec);
    (if words.is_some() { &HEATED } else { &NOT_FOLLOWED }).fetch_add(1, Relaxed);
    words
}

/// The `--stats` line, if the program made or replayed graphs.
pub fn report() -> Option<String> {
    let (captured, replays) = (CAPTURED.load(Relaxed), REPLAYS.load(Relaxed));
    (captured + replays > 0).then(|| {
        format!(
            "tiermem: stats: CUDA graphs: {captured} captured with tiermem's pointers, {replays} replays ({} counted \
             for hotness while chunks were on the host, {} of graphs not followed: built node by node, updated or cloned)",
            HEATED.load(Relaxed),
            NOT_FOLLOWED.load(Relaxed),
        )
    })
}

/// At most [`MAX_WORDS`] of `words`: each distinct pointer once, the most passed first, then
/// their repeats in the same order while there is room, so that what a graph touches is never
/// cut and its heat is as far as the bound allows. Deterministic.
fn compact(words: Vec<u64>) -> Vec<u64> {
    let mut counts: HashMap<u64, usize> = HashMap::new();
    for word in words {
        *counts.entry(word).or_insert(0) += 1;
    }
    let mut ranked: Vec<(u64, usize)> = counts.into_iter().collect();
    ranked.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut out: Vec<u64> = ranked.iter().map(|&(word, _)| word).take(MAX_WORDS).collect();
    for &(word, count) in &ranked {
        let room = MAX_WORDS.saturating_sub(out.len());
        out.extend(std::iter::repeat_n(word, (count - 1).min(room)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_graphs_pointers_are_each_kept_then_repeated_by_how_often_they_were_passed() {
        let words = vec![7, 3, 7, 9, 7, 3];
        assert_eq!(compact(words), [7, 3, 9, 7, 7, 3]);
        let many: Vec<u64> = (0..MAX_WORDS as u64 + 10).chain([5, 5]).collect();
        let kept = compact(many);
        assert_eq!(kept.len(), MAX_WORDS, "bounded");
        assert_eq!(kept[0], 5, "the most passed first");
    }

    #[test]
    fn a_replay_passes_what_its_graphs_capture_passed_until_it_is_destroyed() {
        let (graph, exec) = (0x6a10 as *mut c_void, 0x6a20 as *mut c_void);
        books().get_or_insert_with(Books::default).captures.insert(42, vec![1, 2, 1]);
        capture_ended(42, Some(graph));
        instantiated(exec, graph);
        assert_eq!(words_of(exec).as_deref(), Some(&[1, 2, 1][..]));
        graph_destroyed(graph);
        assert_eq!(words_of(exec).as_deref(), Some(&[1, 2, 1][..]), "an instance outlives its graph");
        instantiated(exec, graph);
        assert_eq!(words_of(exec), None, "re-instantiated from a graph not followed");
        books().get_or_insert_with(Books::default).captures.insert(43, vec![3]);
        capture_ended(43, None);
        assert!(books().as_ref().is_some_and(|b| b.captures.is_empty()), "a failed capture is forgotten");
        exec_destroyed(exec);
    }
}
