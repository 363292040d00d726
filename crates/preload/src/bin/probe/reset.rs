//! Device resets (`cudaDeviceReset`, which is `cuDevicePrimaryCtxReset`) under a budget of
//! 16 MiB: one with allocations never freed before it, chunks moved and a stream-ordered free
//! kept for reuse; one with a small allocation the driver made and tiermem counted. Each frees
//! them all, as it frees the driver's memory, and the program starts again with the whole
//! budget, its chunks moving as before (reset.rs).

use std::ffi::{c_int, c_void};

use super::migration::{begin, free_all, hot_b, locations};
use super::{Code, Free, MIB, PER_THREAD};

type AllocAsync = unsafe extern "C" fn(*mut u64, usize, *mut c_void) -> Code;
type FreeAsync = unsafe extern "C" fn(u64, *mut c_void) -> Code;
type Reset = unsafe extern "C" fn(c_int) -> Code;

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
    cuda.verify(a, 16 * MIB, 11);
    cuda.verify(b, 8 * MIB, 22);
    free_all(&cuda, &[a, b], &before);
    println!("reset: ok");
}
