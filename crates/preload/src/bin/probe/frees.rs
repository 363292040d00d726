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

/// The preload library's exported function `name` (found among everything loaded).
fn exported(name: &std::ffi::CStr) -> *mut c_void {
    // SAFETY: dlsym over everything loaded (the preload library among it), a NUL-terminated name.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    assert!(!f.is_null(), "{name:?} is not exported");
    f
}

type TorchMalloc = unsafe extern "C" fn(isize, std::ffi::c_int, *mut c_void) -> *mut c_void;
type TorchFree = unsafe extern "C" fn(*mut c_void, isize, std::ffi::c_int, *mut c_void);

/// The functions of tiermem's `CUDAPluggableAllocator` (torch_alloc.rs), as PyTorch calls them,
/// under a budget of 16 MiB: a tensor is an allocation of tiermem's ordered on its stream (a free
/// taken back by the next of its size there), one beyond the budget lives on the host, every
/// byte intact; another GPU than the current one, or a negative size, is refused with NULL; a
/// NULL free is nothing; nothing leaks.
pub fn torch_allocator() {
    let cuda = Cuda::load();
    cuda.start();
    let before = cuda.census();
    // SAFETY: the preload library's functions, of these signatures (torch_alloc.rs).
    let (malloc, free) = unsafe {
        (
            std::mem::transmute::<*mut c_void, TorchMalloc>(exported(c"tiermem_torch_malloc")),
            std::mem::transmute::<*mut c_void, TorchFree>(exported(c"tiermem_torch_free")),
        )
    };
    let stream = std::ptr::null_mut();
    // SAFETY: as PyTorch calls them: sizes, the current GPU (0), its legacy stream.
    unsafe {
        let x = malloc(4 * MIB as isize, 0, stream);
        assert!(!x.is_null(), "a tensor of 4 MiB");
        cuda.write_and_verify(x as u64, 4 * MIB, 5);
        free(x, 4 * MIB as isize, 0, stream);
        let y = malloc(4 * MIB as isize, 0, stream);
        assert_eq!(y, x, "the same size on the same stream takes the free back, in stream order");
        free(y, 4 * MIB as isize, 0, stream);
        let big = malloc(24 * MIB as isize, 0, stream);
        assert!(!big.is_null(), "beyond the budget: always mapped");
        assert!(cuda.census().host_chunks >= 4, "the rest on the host");
        cuda.write_and_verify(big as u64, 24 * MIB, 6);
        free(big, 24 * MIB as isize, 0, stream);
        assert!(malloc(MIB as isize, 1, stream).is_null(), "another GPU than the current one");
        // A thread without a current context (PyTorch's autograd threads): served in the GPU's
        // primary context, and left without one again.
        let (malloc_at, free_at) = (malloc as usize, free as usize);
        let t = std::thread::spawn(move || {
            let malloc = std::mem::transmute::<usize, TorchMalloc>(malloc_at);
            let p = malloc(2 * MIB as isize, 0, std::ptr::null_mut()) as u64;
            (p, std::mem::transmute::<usize, TorchFree>(free_at))
        });
        let (p, free_there) = t.join().expect("the thread");
        assert_ne!(p, 0, "a thread without a context gets its tensor");
        cuda.write_and_verify(p, 2 * MIB, 8);
        std::thread::spawn(move || free_there(p as *mut c_void, 2 * MIB as isize, 0, std::ptr::null_mut()))
            .join()
            .expect("the thread");
        assert!(malloc(-1, 0, stream).is_null(), "a negative size");
        assert!(malloc(0, 0, stream).is_null(), "no bytes");
        free(std::ptr::null_mut(), 0, 0, stream);
        // torch.cuda.empty_cache(): what tiermem kept of the freed tensors goes back.
        assert!(cuda.census().held() > before.held(), "frees are kept for reuse");
        // SAFETY: the preload library's function of this signature (torch_alloc.rs).
        let empty: unsafe extern "C" fn() -> std::ffi::c_int =
            std::mem::transmute(exported(c"tiermem_torch_empty_cache"));
        assert_eq!(empty(), 0);
        assert_eq!(cuda.census().held(), before.held(), "empty_cache gave every kept free back");
        // A plain allocation of the whole budget waits for the frees to be done: nothing held after.
        let alloc: Alloc = cuda.get(c"cuMemAlloc", 0);
        let whole: Free = cuda.get(c"cuMemFree", 0);
        let mut z = 0u64;
        assert_eq!(alloc(&mut z, 16 * MIB), 0);
        assert_eq!(cuda.census().host_chunks, 0, "the whole budget in HBM: the freed tensors were given back");
        assert_eq!(whole(z), 0);
    }
    assert_eq!(cuda.census().held(), before.held(), "leak");
    println!("torch-allocator: ok");
}

type TorchStats = unsafe extern "C" fn(std::ffi::c_int, *mut u64, usize) -> std::ffi::c_int;
type BeginCapture = unsafe extern "C" fn(*mut c_void, std::ffi::c_int) -> Code;
type EndCapture = unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> Code;

/// The PyTorch route through a CUDA-graph capture: tensors made or freed while it is under way
/// stay the graph's (never freed, never reused, bytes intact), and PyTorch's memory statistics
/// count them (torch_alloc.rs, torch_stats.rs); then the same through `cuMemAllocAsync` and
/// `cuMemFreeAsync` (captures.rs).
pub fn torch_graphs() {
    let cuda = Cuda::load();
    cuda.start();
    // SAFETY: the preload library's functions, of these signatures (torch_alloc.rs, torch_stats.rs).
    let (malloc, free, stats) = unsafe {
        (
            std::mem::transmute::<*mut c_void, TorchMalloc>(exported(c"tiermem_torch_malloc")),
            std::mem::transmute::<*mut c_void, TorchFree>(exported(c"tiermem_torch_free")),
            std::mem::transmute::<*mut c_void, TorchStats>(exported(c"tiermem_torch_memory_stats")),
        )
    };
    let (begin, end): (BeginCapture, EndCapture) =
        (cuda.get(c"cuStreamBeginCapture", 0), cuda.get(c"cuStreamEndCapture", 0));
    let read = || {
        let mut out = [0u64; 9];
        // SAFETY: a buffer of nine.
        assert_eq!(unsafe { stats(0, out.as_mut_ptr(), 9) }, 9);
        out
    };
    let (stream, len) = (std::ptr::null_mut(), 4 * MIB);
    // SAFETY: as PyTorch calls them, and the driver's capture calls on the legacy stream.
    unsafe {
        let before = malloc(len as isize, 0, stream);
        cuda.write_and_verify(before as u64, len, 1);
        assert_eq!(begin(stream, 0), 0, "cuStreamBeginCapture");
        let during = malloc(len as isize, 0, stream);
        assert!(!during.is_null(), "a tensor during the capture");
        cuda.write_and_verify(during as u64, len, 2);
        free(during, len as isize, 0, stream);
        free(before, len as isize, 0, stream);
        let again = malloc(len as isize, 0, stream);
        assert!(again != during && again != before, "nothing freed during the capture is reused in it");
        let mut graph = std::ptr::null_mut();
        assert_eq!(end(stream, &mut graph), 0, "cuStreamEndCapture");
        let after = malloc(len as isize, 0, stream);
        assert!(![during, before, again].contains(&after), "nor after it: the graph's replays use them");
        assert_eq!(read()[..2], [2 * len as u64, 2 * len as u64], "live now (again, after) and at the peak");
        assert_eq!(read()[6..], [4 * len as u64, 4 * len as u64, 2 * len as u64], "held: live and kept");
        free(again, len as isize, 0, stream);
        free(after, len as isize, 0, stream);
        assert_eq!(read()[8], 3 * len as u64, "made in the capture, freed after it: kept too");
        cuda.verify(during as u64, len, 2);
        cuda.verify(before as u64, len, 1);

        let (alloc_async, free_async): (AllocAsync, FreeAsync) =
            (cuda.get(c"cuMemAllocAsync", 0), cuda.get(c"cuMemFreeAsync", 0));
        let (mut a, mut b) = (0u64, 0u64);
        assert_eq!(begin(stream, 0), 0, "cuStreamBeginCapture");
        assert_eq!(alloc_async(&mut a, len, stream), 0, "cuMemAllocAsync during a capture");
        cuda.write_and_verify(a, len, 3);
        assert_eq!(free_async(a, stream), 0, "cuMemFreeAsync during a capture");
        assert_eq!(alloc_async(&mut b, len, stream), 0);
        assert_ne!(a, b, "not reused in the capture");
        let mut graph = std::ptr::null_mut();
        assert_eq!(end(stream, &mut graph), 0, "cuStreamEndCapture");
        assert_eq!(free_async(b, stream), 0, "made in the capture: kept");
        let mut c = 0u64;
        assert_eq!(alloc_async(&mut c, len, stream), 0);
        assert!(c != a && c != b, "nor after it");
        assert_eq!(free_async(c, stream), 0);
        cuda.verify(a, len, 3);
    }
    println!("torch-graphs: ok");
}
