//! The probe's check of asynchronous frees (`free-async`), under a budget of 16 MiB with the
//! fake's events answering "not ready" to their first ten queries (`TIERMEM_FAKE_EVENT_POLLS`):
//! `cuMemFreeAsync` returns without waiting for its stream, the memory stays the GPU's (and the
//! budget's) until its event completes, a second free gets the driver's error, the same size on
//! the same stream takes it back at once (not on another stream while the event is pending),
//! and an allocation that would not fit waits for the freed memory rather than spill.

use std::ffi::c_void;

use super::{Alloc, Census, Code, Cuda, Free, MIB};

type AllocAsync = unsafe extern "C" fn(*mut u64, usize, *mut c_void) -> Code;
type FreeAsync = unsafe extern "C" fn(u64, *mut c_void) -> Code;

pub fn free_async() {
    let cuda = Cuda::load();
    cuda.start();
    let before = cuda.census();
    let alloc: Alloc = cuda.get(c"cuMemAlloc", 0);
    let free: Free = cuda.get(c"cuMemFree", 0);
    let alloc_async: AllocAsync = cuda.get(c"cuMemAllocAsync", 0);
    let free_async: FreeAsync = cuda.get(c"cuMemFreeAsync", 0);
    let (stream, other) = (std::ptr::null_mut(), 0x5eed as *mut c_void);
    let (mut x, mut w, mut v, mut y, mut z) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let gpu_chunks = |cuda: &Cuda| -> (usize, usize) {
        let Census { gpu_chunks, host_chunks, .. } = cuda.census();
        (gpu_chunks, host_chunks)
    };
    // SAFETY: valid out-pointers, and pointers the allocations gave.
    unsafe {
        assert_eq!(alloc_async(&mut x, 4 * MIB, stream), 0, "cuMemAllocAsync");
        cuda.write_and_verify(x, 4 * MIB, 7);
        let syncs = cuda.census().stream_syncs;
        assert_eq!(free_async(x, stream), 0, "cuMemFreeAsync");
        assert_eq!(cuda.census().stream_syncs, syncs, "it does not wait for its stream");
        assert_eq!(gpu_chunks(&cuda), (2, 0), "the memory stays the GPU's until the stream is done with it");
        assert_eq!(cuda.mem_info().0, 12 * MIB, "and the budget's");
        assert_eq!(free_async(x, stream), 1, "a second free: the driver's CUDA_ERROR_INVALID_VALUE");

        assert_eq!(alloc_async(&mut w, 4 * MIB, stream), 0);
        assert_eq!(w, x, "the same size on the same stream takes it back at once, in stream order");
        assert_eq!(free_async(w, stream), 0);
        assert_eq!(alloc_async(&mut v, 4 * MIB, other), 0);
        assert_ne!(v, x, "another stream does not, while the free's event is pending");
        assert_eq!(gpu_chunks(&cuda), (4, 0));
        assert_eq!(free(v), 0);

        assert_eq!(alloc(&mut y, 2 * MIB), 0, "what fits in the rest");
        assert_eq!(gpu_chunks(&cuda), (3, 0), "the freed memory is not done yet");
        assert_eq!(free(y), 0);

        assert_eq!(alloc(&mut z, 16 * MIB), 0, "the whole budget");
        assert_eq!(gpu_chunks(&cuda), (8, 0), "it waited for the freed memory: all in HBM");
        cuda.write_and_verify(z, 16 * MIB, 9);
        assert_eq!(free(z), 0);
    }
    assert_eq!(cuda.census().held(), before.held(), "leak");
    println!("free-async: ok");
}
