//! The probe's routing check: which door — `dlsym` on libcuda's handle, `RTLD_DEFAULT`,
//! `RTLD_NEXT`, `cuGetProcAddress_v2` by version and stream flavour — gives tiermem's wrapper and
//! which the driver's own function, and that the driver's refusals come back unchanged.

use std::ffi::{c_void, CStr};

use super::{Cuda, LEGACY, PER_THREAD};

/// Where the function at `p` lives: the path of its shared object.
fn home(p: *mut c_void) -> String {
    // SAFETY: an all-zero Dl_info is valid; dladdr fills it.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid out-pointer; `p` is only looked up.
    if unsafe { libc::dladdr(p, &mut info) } == 0 || info.dli_fname.is_null() {
        return "?".into();
    }
    // SAFETY: dladdr set a NUL-terminated path.
    unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned()
}

pub fn assert_tiermem(p: *mut c_void, what: &str) {
    assert!(home(p).contains("libtiermem_preload"), "{what} should be tiermem's, is in {}", home(p));
}

pub fn assert_driver(p: *mut c_void, what: &str) {
    assert!(!home(p).contains("libtiermem_preload"), "{what} should be the driver's, is tiermem's");
}

pub fn routing() {
    let cuda = Cuda::load();
    assert_tiermem(cuda.get_proc as *mut c_void, "dlsym(libcuda, cuGetProcAddress_v2)");
    assert_tiermem(Cuda::dlsym(cuda.handle, c"cuGetProcAddress"), "dlsym(libcuda, cuGetProcAddress)");
    assert_tiermem(Cuda::dlsym(cuda.handle, c"cuMemAlloc_v2"), "dlsym(libcuda, cuMemAlloc_v2)");
    assert_tiermem(Cuda::dlsym(libc::RTLD_DEFAULT, c"cuMemFree_v2"), "dlsym(RTLD_DEFAULT, cuMemFree_v2)");
    assert_tiermem(
        Cuda::dlsym(cuda.handle, c"cuMemcpyHtoD_v2"),
        "dlsym(libcuda, cuMemcpyHtoD_v2): copies hold the gate",
    );
    assert_driver(Cuda::dlsym(cuda.handle, c"cuDeviceGet"), "dlsym(libcuda, cuDeviceGet)");
    // RTLD_NEXT is resolved relative to the object that calls dlsym, here the program: the next
    // `dlsym` after it is tiermem's own (the first one RTLD_DEFAULT finds), not glibc's, which
    // is what a lookup made as if from tiermem's library would give.
    let next = Cuda::dlsym(libc::RTLD_NEXT, c"dlsym");
    assert_eq!(next, Cuda::dlsym(libc::RTLD_DEFAULT, c"dlsym"), "dlsym(RTLD_NEXT, dlsym) from the program");
    assert_tiermem(next, "dlsym(RTLD_NEXT, dlsym) from the program");
    assert_tiermem(Cuda::dlsym(libc::RTLD_NEXT, c"cuMemAlloc_v2"), "dlsym(RTLD_NEXT, cuMemAlloc_v2) from the program");

    let alloc = cuda.proc(c"cuMemAlloc", 12000, 0).2;
    assert_tiermem(alloc, "cuGetProcAddress(cuMemAlloc)");
    assert_eq!(alloc, Cuda::dlsym(cuda.handle, c"cuMemAlloc_v2"), "both doors give one cuMemAlloc_v2");
    let legacy = cuda.proc(c"cuMemAllocAsync", 12000, LEGACY).2;
    let per_thread = cuda.proc(c"cuMemAllocAsync", 12000, PER_THREAD).2;
    assert_tiermem(legacy, "cuMemAllocAsync (legacy stream)");
    assert_tiermem(per_thread, "cuMemAllocAsync (per-thread stream)");
    assert_ne!(legacy, per_thread, "the per-thread variant is a wrapper of its own");
    assert_eq!(per_thread, Cuda::dlsym(cuda.handle, c"cuMemAllocAsync_ptsz"));
    assert_tiermem(cuda.proc(c"cuMemFreeAsync", 12000, PER_THREAD).2, "cuMemFreeAsync_ptsz");
    let (from_pool, from_pool_ptsz) =
        (cuda.proc(c"cuMemAllocFromPoolAsync", 12000, 0).2, cuda.proc(c"cuMemAllocFromPoolAsync", 12000, PER_THREAD).2);
    assert_tiermem(from_pool, "cuMemAllocFromPoolAsync");
    assert_eq!(from_pool_ptsz, Cuda::dlsym(cuda.handle, c"cuMemAllocFromPoolAsync_ptsz"));
    assert_ne!(from_pool, from_pool_ptsz, "cuMemAllocFromPoolAsync_ptsz has a wrapper of its own");
    assert_tiermem(cuda.proc(c"cuMemPoolTrimTo", 12000, 0).2, "cuMemPoolTrimTo");
    assert_tiermem(cuda.proc(c"cuMemPoolCreate", 12000, 0).2, "cuMemPoolCreate (a plain pool is served)");
    assert_tiermem(cuda.proc(c"cuGetProcAddress", 12000, 0).2, "cuGetProcAddress(cuGetProcAddress)");
    assert_tiermem(cuda.proc(c"cuMemGetInfo", 12000, 0).2, "cuGetProcAddress(cuMemGetInfo)");
    let sync = cuda.proc(c"cuStreamSynchronize", 12000, PER_THREAD).2;
    assert_tiermem(sync, "cuStreamSynchronize_ptsz (a quiesce point)");
    assert_eq!(sync, Cuda::dlsym(cuda.handle, c"cuStreamSynchronize_ptsz"));
    assert_tiermem(cuda.proc(c"cuCtxSynchronize", 12000, 0).2, "cuCtxSynchronize");
    let (launch, launch_ptsz) =
        (cuda.proc(c"cuLaunchKernel", 12000, 0).2, cuda.proc(c"cuLaunchKernel", 12000, PER_THREAD).2);
    assert_tiermem(launch, "cuLaunchKernel");
    assert_tiermem(launch_ptsz, "cuLaunchKernel_ptsz");
    assert_ne!(launch, launch_ptsz, "each launch flavour has its wrapper");
    assert_driver(cuda.proc(c"cuFuncGetParamInfo", 12040, 0).2, "cuFuncGetParamInfo");

    // The driver's own refusals come back unchanged: an old version, an unknown name.
    let (code, status, f) = cuda.proc(c"cuMemAllocAsync", 11000, 0);
    assert_eq!((code, status, f.is_null()), (500, 2, true), "cuMemAllocAsync for CUDA 11.0");
    let (code, status, f) = cuda.proc(c"cuNoSuchFunction", 12000, 0);
    assert_eq!((code, status, f.is_null()), (500, 1, true), "an unknown symbol");
    let (code, _, f) = cuda.proc(c"cuMemAlloc_v2", 12000, 0);
    assert_eq!((code, f.is_null()), (500, true), "versioned names are not the driver's base names");
    println!("routing: ok");
}
