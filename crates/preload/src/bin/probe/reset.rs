//! Contexts going away, under a budget of 16 MiB.
//!
//! `reset`: device resets (`cudaDeviceReset`, which is `cuDevicePrimaryCtxReset`), one with
//! allocations never freed before it, chunks moved and a stream-ordered free kept for reuse;
//! one with a small allocation the driver made and tiermem counted. Each frees them all, as it
//! frees the driver's memory, and the program starts again with the whole budget, its chunks
//! moving as before (reset.rs).
//!
//! `contexts`: a context of the program's own (`cuCtxCreate_v2`, as PyCUDA makes one). Chunks
//! allocated in it move at its synchronizations, the migration waiting for it — also when the
//! primary context is the one synchronized; destroying it frees what was made in it and never
//! freed, tiermem's and the driver's, and the program goes on in the primary context with the
//! whole budget (contexts.rs). `contexts-threads`: two threads make, use and destroy contexts
//! over and over while the main thread synchronizes in a loop, each synchronization a migration
//! that waits for the contexts alive: nothing faults, no byte is lost, nothing is left.

use std::ffi::{c_int, c_uint, c_void};

use std::sync::atomic::AtomicUsize;

use super::migration::{
    begin, free_all, hbm_in_use, hot_b, locations, synchronize_until, verify_and_free, Done, READS,
};
use super::{Code, Free, MIB, PER_THREAD};

type AllocAsync = unsafe extern "C" fn(*mut u64, usize, *mut c_void) -> Code;
type FreeAsync = unsafe extern "C" fn(u64, *mut c_void) -> Code;
type Reset = unsafe extern "C" fn(c_int) -> Code;
type Create = unsafe extern "C" fn(*mut *mut c_void, c_uint, c_int) -> Code;
type Destroy = unsafe extern "C" fn(*mut c_void) -> Code;
type PopCurrent = unsafe extern "C" fn(*mut *mut c_void) -> Code;
type PushCurrent = unsafe extern "C" fn(*mut c_void) -> Code;
type Syncs = extern "C" fn(*mut c_void) -> isize;

pub fn reset() {
    let (cuda, before, kernels, sync, alloc) = begin();
    let (alloc_async, free_async): (AllocAsync, FreeAsync) =
        (cuda.get(c"cuMemAllocAsync", PER_THREAD), cuda.get(c"cuMemFreeAsync", PER_THREAD));
    let reset: Reset = cuda.get(c"cuDevicePrimaryCtxReset", 0);
    let free: Free = cuda.get(c"cuMemFree", 0);
    let (a, b) = hot_b(&cuda, &kernels);
    // SAFETY: the driver's synchronization: B, hot, comes up; A's cold chunks go down.
    assert_eq!(unsafe { sync() }, 0);
    assert_eq!(locations(&cuda, b, 8 * MIB), [1; 4], "B came up before the reset");
    let mut kept = 0u64;
    // SAFETY: the driver's (tiermem's) functions with a valid out-pointer, and the pointer it gave.
    unsafe {
        assert_eq!(alloc_async(&mut kept, MIB, std::ptr::null_mut()), 0);
        assert_eq!(free_async(kept, std::ptr::null_mut()), 0, "freed in stream order: kept for reuse");
    }

    // SAFETY: the driver's (tiermem's) reset of GPU 0.
    assert_eq!(unsafe { reset(0) }, 0, "cuDevicePrimaryCtxReset");
    assert_eq!(cuda.census().held(), before.held(), "a reset leaves nothing held: it frees every allocation");
    cuda.start();
    assert_eq!(cuda.mem_info(), (16 * MIB, 16 * MIB), "the whole budget is free after a reset");
    // SAFETY: a pointer the reset freed: the driver's answer, as without tiermem.
    assert_eq!(unsafe { free(a) }, 1, "a pointer the reset freed: the driver's CUDA_ERROR_INVALID_VALUE");

    // A small allocation, the driver's (counted against the budget), then a second reset.
    let mut small = 0u64;
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { alloc(&mut small, 64 << 10) }, 0);
    assert!(cuda.mem_info().0 < 16 * MIB, "the small allocation is counted");
    // SAFETY: as above.
    assert_eq!(unsafe { reset(0) }, 0, "a second cuDevicePrimaryCtxReset");
    assert_eq!(cuda.census().held(), before.held(), "the driver freed the small allocation");
    cuda.start();
    assert_eq!(cuda.mem_info(), (16 * MIB, 16 * MIB), "and it counts no more");
    // SAFETY: as above.
    assert_eq!(unsafe { free(small) }, 1, "the small pointer the reset freed: the driver's error");

    // The program starts again: allocations, moves and bytes as before the resets.
    let (a, b) = hot_b(&cuda, &kernels);
    // SAFETY: the driver's synchronization.
    assert_eq!(unsafe { sync() }, 0);
    assert_eq!(locations(&cuda, b, 8 * MIB), [1; 4], "B, hot, came up after the resets too");
    verify_and_free(&cuda, (a, b), &before);
    println!("reset: ok");
}

pub fn contexts() {
    let (cuda, before, kernels, sync, alloc) = begin();
    let (create, destroy): (Create, Destroy) = (cuda.get(c"cuCtxCreate", 0), cuda.get(c"cuCtxDestroy", 0));
    let (pop, push): (PopCurrent, PushCurrent) = (cuda.get(c"cuCtxPopCurrent", 0), cuda.get(c"cuCtxPushCurrent", 0));
    let (free, syncs): (Free, Syncs) = (cuda.get(c"cuMemFree", 0), cuda.fake(c"tiermem_fake_context_syncs"));
    let mut ctx = std::ptr::null_mut();
    // SAFETY: a valid out-pointer: the new context, current on this thread from now on.
    assert_eq!(unsafe { create(&mut ctx, 0, 0) }, 0, "cuCtxCreate_v2");
    let (a, b) = hot_b(&cuda, &kernels);
    // SAFETY: the driver's synchronization, of the program's context: B, hot, comes up.
    assert_eq!(unsafe { sync() }, 0);
    assert_eq!(locations(&cuda, b, 8 * MIB), [1; 4], "B came up in a context of the program's own");
    cuda.verify(b, 8 * MIB, 22);

    // The primary context current, a buffer of its own made hot: its synchronization moves it,
    // the migration waiting for the program's context too.
    let mut popped = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the primary context is below the program's on this thread.
    assert_eq!(unsafe { pop(&mut popped) }, 0, "cuCtxPopCurrent_v2");
    assert_eq!(popped, ctx);
    let mut c = 0u64;
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { alloc(&mut c, 8 * MIB) }, 0);
    assert_eq!(locations(&cuda, c, 8 * MIB), [2; 4], "C lands on the host: the budget is full");
    cuda.write(c, 8 * MIB, 33);
    for _ in 0..20 {
        let mut args = [c as *mut c_void, (c + 4 * MIB as u64) as *mut c_void, std::ptr::null_mut()];
        assert_eq!(kernels.launch(READS, &mut args), 0, "a launch on C");
    }
    let waited = syncs(ctx);
    // SAFETY: the driver's synchronization, of the primary context.
    assert_eq!(unsafe { sync() }, 0);
    assert_eq!(locations(&cuda, c, 8 * MIB), [1; 4], "C came up at the primary context's synchronization");
    assert!(syncs(ctx) > waited, "the migration waited for the program's context too");
    cuda.verify(c, 8 * MIB, 33);

    // Back in the program's context: a small allocation (the driver's, counted), then the
    // context destroyed with A, B and it never freed.
    // SAFETY: the context this thread popped.
    assert_eq!(unsafe { push(ctx) }, 0, "cuCtxPushCurrent_v2");
    let mut small = 0u64;
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { alloc(&mut small, 64 << 10) }, 0);
    // SAFETY: the program's context, current on this thread: the primary one is current after.
    assert_eq!(unsafe { destroy(ctx) }, 0, "cuCtxDestroy_v2");
    assert_eq!(cuda.mem_info().0, 8 * MIB, "only C is left counted: A, B and the small one went with the context");
    // SAFETY: pointers the destruction freed: the driver's answer, as without tiermem.
    unsafe {
        assert_eq!(free(a), 1, "A went with its context: the driver's CUDA_ERROR_INVALID_VALUE");
        assert_eq!(free(small), 1, "the small one too");
    }
    cuda.verify(c, 8 * MIB, 33);
    let mut d = 0u64;
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { alloc(&mut d, 8 * MIB) }, 0);
    assert_eq!(locations(&cuda, d, 8 * MIB), [1; 4], "D fits beside C: the budget is the program's again");
    cuda.write_and_verify(d, 8 * MIB, 44);
    free_all(&cuda, &[c, d], &before);
    println!("contexts: ok");
}

pub fn contexts_threads() {
    const ROUNDS: usize = 40;
    let (cuda, before, kernels, sync, alloc) = begin();
    let (a, b) = hot_b(&cuda, &kernels);
    let (create, destroy): (Create, Destroy) = (cuda.get(c"cuCtxCreate", 0), cuda.get(c"cuCtxDestroy", 0));
    let free: Free = cuda.get(c"cuMemFree", 0);
    let (done, syncs) = (AtomicUsize::new(0), AtomicUsize::new(0));
    std::thread::scope(|scope| {
        for t in 0..2 {
            let (cuda, kernels, done) = (&cuda, &kernels, &done);
            scope.spawn(move || {
                // Counted even if an assertion fails, so that the main thread stops waiting.
                let _done = Done(done);
                cuda.start();
                for round in 0..ROUNDS {
                    let (mut ctx, mut p) = (std::ptr::null_mut(), 0u64);
                    let seed = (100 + t * ROUNDS + round) as u8;
                    // SAFETY: valid out-pointers, and the context and pointer the driver gave.
                    unsafe {
                        assert_eq!(create(&mut ctx, 0, 0), 0, "thread {t} round {round}: cuCtxCreate_v2");
                        assert_eq!(alloc(&mut p, 2 * MIB), 0);
                        cuda.write(p, 2 * MIB, seed);
                        for _ in 0..4 {
                            let mut args = [p as *mut c_void, (p + MIB as u64) as *mut c_void, std::ptr::null_mut()];
                            assert_eq!(kernels.launch(READS, &mut args), 0, "thread {t} round {round}: a launch");
                        }
                        assert_eq!(sync(), 0, "thread {t} round {round}: its context's synchronization");
                        cuda.verify(p, 2 * MIB, seed);
                        if round % 2 == 0 {
                            assert_eq!(free(p), 0);
                        }
                        // Every other round's allocation goes with its context.
                        assert_eq!(destroy(ctx), 0, "thread {t} round {round}: cuCtxDestroy_v2");
                    }
                }
            });
        }
        synchronize_until(sync, &done, 2, &syncs);
    });
    assert!(hbm_in_use(&cuda) <= 16 * MIB, "within the budget");
    // The whole budget free once A and B are, and nothing held: the contexts' allocations went.
    verify_and_free(&cuda, (a, b), &before);
    println!("contexts-threads: ok");
}
