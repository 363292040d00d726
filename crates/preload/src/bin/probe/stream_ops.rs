//! Stream memory operations and batched copies under migration: they read and write device
//! addresses from a stream, so tiermem routes them through its gate (gated.rs) like copies. Over
//! the fake driver, where each operation runs at once, one enqueued while a chunk is moved would
//! land in the chunk being left (lost) or find it unmapped (an error). With the wrapper's gate
//! taken out, a write was lost within a run, three runs of three.

use std::ffi::{c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use super::migration::{begin, free_all, hbm_in_use, locations, synchronize_until, zeroed_pair, WRITES};
use super::{Code, Cuda, MIB};

type WriteValue32 = unsafe extern "C" fn(*mut c_void, u64, u32, c_uint) -> Code;
type BatchCopy = unsafe extern "C" fn(
    *const u64,
    *const u64,
    *const usize,
    usize,
    *const c_void,
    *const usize,
    usize,
    *mut c_void,
) -> Code;

/// Reads the 4-byte word at `ptr`.
fn word(cuda: &Cuda, ptr: u64) -> u32 {
    u32::from_le_bytes(cuda.read(ptr, 4).try_into().expect("4 bytes"))
}

/// One thread launches kernels on A and B by turns (so that chunks keep moving both ways at the
/// main thread's synchronizations) while two others write words in B and A by turns with
/// `cuStreamWriteValue32`, each write read back at once, and copy each word they wrote with
/// `cuMemcpyBatchAsync` (CUDA 13's) to a word of their own: no write may be lost or refused.
/// The writers go on until B has moved `MOVES` times, however the threads are scheduled.
pub fn stream_writes() {
    const WRITES_EACH: u32 = 300;
    const MOVES: usize = 6;
    const MOST_WRITES: u32 = 100_000;
    const WORDS: u64 = 32;
    const RUNS: u32 = 40;
    let (cuda, before, kernels, sync, alloc) = begin();
    let write_value: WriteValue32 = cuda.get(c"cuStreamWriteValue32", 0);
    let (_, _, batch) = cuda.proc(c"cuMemcpyBatchAsync", 13000, 0);
    super::assert_tiermem(write_value as *mut c_void, "cuStreamWriteValue32 (a stream memory operation)");
    super::assert_tiermem(batch, "cuMemcpyBatchAsync for CUDA 13");
    // SAFETY: cuMemcpyBatchAsync_v2's C signature.
    let batch: BatchCopy = unsafe { std::mem::transmute::<*mut c_void, BatchCopy>(batch) };
    let (a, b) = zeroed_pair(&cuda, alloc);
    let at = |base: u64, t: u64| base + t * 5 * MIB as u64 + 4096;
    let (done, syncs, moves) = (AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0));
    std::thread::scope(|scope| {
        let (cuda, kernels, done, syncs, moves) = (&cuda, &kernels, &done, &syncs, &moves);
        scope.spawn(move || {
            cuda.start();
            let mut seen_at = locations(cuda, b, 16 * MIB);
            // Until both writers are done: phases of launches on every chunk of B, then of A,
            // each after two quiesce points, so that all of B comes up and goes down by turns.
            for phase in 0.. {
                if done.load(SeqCst) >= 2 {
                    break;
                }
                let now_at = locations(cuda, b, 16 * MIB);
                if now_at != seen_at {
                    moves.fetch_add(1, SeqCst);
                    seen_at = now_at;
                }
                let seen = syncs.load(SeqCst);
                while syncs.load(SeqCst) < seen + 2 && done.load(SeqCst) < 2 {
                    std::thread::yield_now();
                }
                let base = if phase % 2 == 0 { b } else { a };
                for _ in 0..4 {
                    for chunk in 0..8u64 {
                        let target = base + chunk * 2 * MIB as u64 + 3 * MIB as u64 / 2;
                        assert_eq!(kernels.launch(WRITES, &mut [target as *mut c_void]), 0, "phase {phase}");
                    }
                }
            }
        });
        for t in 0..2u64 {
            scope.spawn(move || {
                let _done = super::migration::Done(done);
                cuda.start();
                let mut value = 0;
                while value < WRITES_EACH || (moves.load(SeqCst) < MOVES && value < MOST_WRITES) {
                    value += 1;
                    let (place, copy) = if (value / 50) % 2 == 0 { (at(b, t), at(a, t)) } else { (at(a, t), at(b, t)) };
                    // Runs of writes, each to all of `WORDS` words 64 bytes apart with the next of
                    // `RUNS` values, then one batched copy of them all, then a look at both: most
                    // of a writer's time is spent in the operations under test, not in the reads
                    // that check them, and a write lost late in the runs leaves an older value.
                    let dsts: Vec<u64> = (0..WORDS).map(|k| copy + 64 * k).collect();
                    let srcs: Vec<u64> = (0..WORDS).map(|k| place + 64 * k).collect();
                    let sizes = vec![4usize; WORDS as usize];
                    // SAFETY: the driver's (tiermem's) functions, on addresses of live allocations,
                    // with arrays of `WORDS` entries each.
                    unsafe {
                        for run in (1..=RUNS).rev() {
                            for &at in &srcs {
                                let code = write_value(std::ptr::null_mut(), at, value * RUNS + 1 - run, 0);
                                assert_eq!(code, 0, "thread {t} write {value}");
                            }
                        }
                        let (no_attributes, no_indices) = (std::ptr::null(), std::ptr::null());
                        let (count, stream) = (sizes.len(), std::ptr::null_mut());
                        let code = batch(
                            dsts.as_ptr(),
                            srcs.as_ptr(),
                            sizes.as_ptr(),
                            count,
                            no_attributes,
                            no_indices,
                            0,
                            stream,
                        );
                        assert_eq!(code, 0, "thread {t} batch copy {value}");
                    }
                    let value = value * RUNS;
                    for (k, (&written, &copied)) in srcs.iter().zip(&dsts).enumerate() {
                        assert_eq!(word(cuda, written), value, "thread {t}: write {value} to word {k} lost to a move");
                        assert_eq!(
                            word(cuda, copied),
                            value,
                            "thread {t}: batch copy {value} of word {k} lost to a move"
                        );
                    }
                }
            });
        }
        synchronize_until(sync, done, 2, syncs);
    });
    assert!(moves.load(SeqCst) >= MOVES, "void: B moved {} times while threads wrote", moves.load(SeqCst));
    assert_eq!(hbm_in_use(&cuda), 16 * MIB);
    free_all(&cuda, &[a, b], &before);
    println!("stream-writes: ok");
}
