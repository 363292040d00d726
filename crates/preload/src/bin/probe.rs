//! A CUDA program for the preload library's tests: it loads `libcuda.so.1` with `dlopen`, as
//! the CUDA runtime does, fetches entry points by `dlsym` and `cuGetProcAddress_v2`, and
//! checks what it gets. Run with `LD_PRELOAD=libtiermem_preload.so` over the fake driver
//! (crates/fakecuda) by tests/; exits non-zero, saying why, on the first check that fails.
//!
//! `tiermem-preload-probe routing` — which door gives which function (probe/routing.rs).
//! `tiermem-preload-probe memory` — a budget of 64 MiB (`TIERMEM_HBM_LIMIT`): allocations
//! within and beyond it, bytes written and read back, bad frees, zero bytes, leaks.
//! `tiermem-preload-probe no-host-chunks` — a budget of 8 MiB over a driver without host
//! chunks: beyond the budget is `CUDA_ERROR_OUT_OF_MEMORY`, and nothing leaks.
//! `tiermem-preload-probe budget BYTES` — `cuMemGetInfo_v2` reports `BYTES` as the total.
//! `tiermem-preload-probe gpu-full` — a budget of 64 MiB on a GPU of 8 MiB: when the GPU is
//! full before the budget is, the rest of an allocation goes to the host.
//! `tiermem-preload-probe migrate` — under a budget of 16 MiB, kernels launched on the
//! allocation that landed on the host bring it up at the next synchronization, and the cold one
//! goes down; every byte stays (with `TIERMEM_MIGRATE=off`, nothing moves). `migrate-fail CALL N [MOVED]`:
//! the same with the Nth call of CALL failing mid-migration. `migrate-threads`: threads launch
//! kernels that write while another synchronizes, and migrates; `migrate-capture`: nothing moves
//! while a stream capture is under way (src/bin/probe/migration.rs); `graphs`: a graph's replays
//! heat what its capture's launches passed (probe/graphs.rs); `stream-writes`: stream
//! memory operations and batched copies from other threads meanwhile (src/bin/probe/stream_ops.rs);
//! `reset`, `contexts`, `contexts-threads`: a device reset, contexts of the program's own
//! (probe/reset.rs).
//! `tiermem-preload-probe segments` — stage 3: a loop over more buffers than the budget, one
//! synchronization per cycle, finds each buffer in HBM when its kernel runs once the cycle is
//! recorded; diverging cycles run correctly; every byte stays; `segments-alternate`: two
//! different cycles a step, told apart (src/bin/probe/segments.rs).
//! `… lease` — a tenant of the node daemon, over stdin (probe/lease.rs). `… ipc` — an allocation
//! shared with a child by legacy IPC handles, written on both sides, never moved; `… ranges` —
//! address ranges and pointer attributes (probe/ipc.rs). `… free-async` — `cuMemFreeAsync`
//! ordered on its stream (probe/frees.rs). `… pools` — which pools' allocations are tiermem's.
//! `tiermem-preload-probe vmm`, `vmm-room` — the program's own `cuMemCreate` chunks are counted
//! against the budget, made on the host beyond it unless tiermem's can make room (probe/vmm.rs).
//! `tiermem-preload-probe threads` — four threads allocate (two at a time), verify and free at
//! once under a budget of 16 MiB; every byte reads back, the budget is whole again, nothing leaks.

#[path = "probe/frees.rs"]
mod frees;
#[path = "probe/graphs.rs"]
mod graphs;
#[path = "probe/ipc.rs"]
mod ipc;
#[path = "probe/lease.rs"]
mod lease;
#[path = "probe/migration.rs"]
mod migration;
#[path = "probe/neighbours.rs"]
mod neighbours;
#[path = "probe/pools.rs"]
mod pools;
#[path = "probe/reset.rs"]
mod reset;
#[path = "probe/routing.rs"]
mod routing;
#[path = "probe/segments.rs"]
mod segments;
#[path = "probe/stream_ops.rs"]
mod stream_ops;
#[path = "probe/vmm.rs"]
mod vmm;

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use routing::{assert_driver, assert_tiermem};

type Code = u32;
type GetProc = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> Code;
type Alloc = unsafe extern "C" fn(*mut u64, usize) -> Code;
type AllocAsync = unsafe extern "C" fn(*mut u64, usize, *mut c_void) -> Code;
type AllocPitch = unsafe extern "C" fn(*mut u64, *mut usize, usize, usize, c_uint) -> Code;
type AllocManaged = unsafe extern "C" fn(*mut u64, usize, c_uint) -> Code;
type Free = unsafe extern "C" fn(u64) -> Code;
type FreeAsync = unsafe extern "C" fn(u64, *mut c_void) -> Code;
type GetInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> Code;
type CopyIn = unsafe extern "C" fn(u64, *const c_void, usize) -> Code;
type CopyOut = unsafe extern "C" fn(*mut c_void, u64, usize) -> Code;

#[repr(C)]
#[derive(Debug, Default, PartialEq, Eq)]
struct Census {
    gpu_chunks: usize,
    host_chunks: usize,
    reservations: usize,
    mappings: usize,
    plain: usize,
    used_bytes: usize,
    context_syncs: usize,
    stream_syncs: usize,
    last_synced_stream: usize,
    peak_used_bytes: usize,
    neighbour_chunks: usize,
    neighbour_used_bytes: usize,
}

impl Census {
    /// What is held, without the synchronization counters.
    fn held(&self) -> [usize; 6] {
        [self.gpu_chunks, self.host_chunks, self.reservations, self.mappings, self.plain, self.used_bytes]
    }
}

const MIB: usize = 1 << 20;
const LEGACY: u64 = 1;
const PER_THREAD: u64 = 2;

/// The loaded driver, as a program sees it.
struct Cuda {
    handle: *mut c_void,
    get_proc: GetProc,
}

// SAFETY: the handle and the function pointer never change after `load`; dlsym and the
// driver's functions may be called from any thread.
unsafe impl Sync for Cuda {}

impl Cuda {
    fn load() -> Cuda {
        // SAFETY: dlopen of a library name; the handle is kept for the life of the process.
        let handle = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW) };
        assert!(!handle.is_null(), "dlopen(libcuda.so.1) failed");
        let get_proc = Self::dlsym(handle, c"cuGetProcAddress_v2");
        // SAFETY: cuGetProcAddress_v2 has the `GetProc` signature.
        Cuda { handle, get_proc: unsafe { std::mem::transmute::<*mut c_void, GetProc>(get_proc) } }
    }

    fn dlsym(handle: *mut c_void, name: &CStr) -> *mut c_void {
        // SAFETY: a handle from dlopen (or a pseudo-handle) and a NUL-terminated name.
        let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
        assert!(!p.is_null(), "dlsym({name:?}) found nothing");
        p
    }

    /// `cuGetProcAddress_v2(name, version, flags)`: the result code, the query status, the function.
    fn proc(&self, name: &CStr, version: c_int, flags: u64) -> (Code, c_int, *mut c_void) {
        let (mut f, mut status) = (std::ptr::null_mut(), -1);
        // SAFETY: the driver's cuGetProcAddress_v2 (or tiermem's) with valid out-pointers.
        let code = unsafe { (self.get_proc)(name.as_ptr(), &mut f, version, flags, &mut status) };
        (code, status, f)
    }

    /// The function `name` means for a CUDA 12 caller, as type `F`.
    fn get<F: Copy>(&self, name: &CStr, flags: u64) -> F {
        let (code, _, f) = self.proc(name, 12000, flags);
        assert!(code == 0 && !f.is_null(), "cuGetProcAddress_v2({name:?}) = {code}");
        assert_eq!(size_of::<F>(), size_of::<*mut c_void>());
        // SAFETY: `F` is the function pointer type of `name` (the caller names both).
        unsafe { std::mem::transmute_copy::<*mut c_void, F>(&f) }
    }

    fn census(&self) -> Census {
        let census: unsafe extern "C" fn(*mut Census) -> Code = self.fake(c"tiermem_fake_census");
        let mut out = Census::default();
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { census(&mut out) }, 0);
        out
    }

    /// cuInit, and the primary context of GPU 0 made current.
    fn start(&self) {
        let init: unsafe extern "C" fn(c_uint) -> Code = self.get(c"cuInit", 0);
        let device_get: unsafe extern "C" fn(*mut c_int, c_int) -> Code = self.get(c"cuDeviceGet", 0);
        let retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> Code = self.get(c"cuDevicePrimaryCtxRetain", 0);
        let set_current: unsafe extern "C" fn(*mut c_void) -> Code = self.get(c"cuCtxSetCurrent", 0);
        let (mut device, mut ctx) = (-1, std::ptr::null_mut());
        // SAFETY: the driver's functions with valid out-pointers and the handles they gave.
        unsafe {
            assert_eq!(init(0), 0, "cuInit");
            assert_eq!(device_get(&mut device, 0), 0, "cuDeviceGet");
            assert_eq!(retain(&mut ctx, device), 0, "cuDevicePrimaryCtxRetain");
            assert_eq!(set_current(ctx), 0, "cuCtxSetCurrent");
        }
    }

    fn mem_info(&self) -> (usize, usize) {
        let get_info: GetInfo = self.get(c"cuMemGetInfo", 0);
        let (mut free, mut total) = (0, 0);
        // SAFETY: valid out-pointers.
        assert_eq!(unsafe { get_info(&mut free, &mut total) }, 0, "cuMemGetInfo_v2");
        (free, total)
    }

    /// Writes a pattern of `seed` over `len` bytes at `ptr` and reads it back.
    fn write_and_verify(&self, ptr: u64, len: usize, seed: u8) {
        self.write(ptr, len, seed);
        self.verify(ptr, len, seed);
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed).wrapping_add((i >> 12) as u8)).collect()
    }

    /// Writes the pattern of `seed` over `len` bytes at `ptr`.
    fn write(&self, ptr: u64, len: usize, seed: u8) {
        let copy_in: CopyIn = self.get(c"cuMemcpyHtoD", 0);
        let bytes = Self::pattern(len, seed);
        // SAFETY: the host buffer holds `len` bytes; `ptr` is device memory of `len` bytes.
        assert_eq!(unsafe { copy_in(ptr, bytes.as_ptr().cast(), len) }, 0, "cuMemcpyHtoD_v2 to 0x{ptr:x}");
    }

    /// The `len` bytes at `ptr`.
    fn read(&self, ptr: u64, len: usize) -> Vec<u8> {
        let copy_out: CopyOut = self.get(c"cuMemcpyDtoH", 0);
        let mut back = vec![0u8; len];
        // SAFETY: the host buffer holds `len` bytes; `ptr` is device memory of `len` bytes.
        assert_eq!(unsafe { copy_out(back.as_mut_ptr().cast(), ptr, len) }, 0, "cuMemcpyDtoH_v2 from 0x{ptr:x}");
        back
    }

    /// Checks that the `len` bytes at `ptr` are the pattern of `seed`.
    fn verify(&self, ptr: u64, len: usize, seed: u8) {
        let first_bad = Self::pattern(len, seed).iter().zip(&self.read(ptr, len)).position(|(a, b)| a != b);
        assert_eq!(first_bad, None, "bytes read back differ from those written at 0x{ptr:x}");
    }

    /// A function of the fake driver's own (not a driver function), as type `F`.
    fn fake<F: Copy>(&self, name: &CStr) -> F {
        let f = Self::dlsym(self.handle, name);
        // SAFETY: `F` is the signature of `name` in crates/fakecuda (the caller names both).
        unsafe { std::mem::transmute_copy::<*mut c_void, F>(&f) }
    }
}

fn memory() {
    let cuda = Cuda::load();
    cuda.start();
    let alloc: Alloc = cuda.get(c"cuMemAlloc", 0);
    let free: Free = cuda.get(c"cuMemFree", 0);
    let alloc_async: AllocAsync = cuda.get(c"cuMemAllocAsync", PER_THREAD);
    let free_async: FreeAsync = cuda.get(c"cuMemFreeAsync", PER_THREAD);
    let alloc_pitch: AllocPitch = cuda.get(c"cuMemAllocPitch", 0);
    let alloc_managed: AllocManaged = cuda.get(c"cuMemAllocManaged", 0);
    let before = cuda.census();
    assert_eq!(cuda.mem_info(), (64 * MIB, 64 * MIB), "cuMemGetInfo_v2 reports the budget");

    let (mut a, mut b, mut c, mut d, mut m) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut pitch = 0usize;
    // SAFETY: the driver's (tiermem's) functions with valid out-pointers, and pointers they gave.
    unsafe {
        assert_eq!(alloc(&mut a, 3 * MIB), 0, "3 MiB within the budget");
        cuda.write_and_verify(a, 3 * MIB, 1);
        assert_eq!(cuda.mem_info().0, 60 * MIB, "3 MiB round up to two 2 MiB chunks");

        assert_eq!(alloc(&mut b, 100 * MIB), 0, "100 MiB, beyond the budget");
        let census = cuda.census();
        assert_eq!((census.gpu_chunks, census.host_chunks), (32, 20), "HBM up to the budget, the rest on the host");
        cuda.write_and_verify(b, 100 * MIB, 2);
        assert_eq!(cuda.mem_info(), (0, 64 * MIB));

        assert_eq!(alloc_async(&mut c, MIB, std::ptr::null_mut()), 0, "cuMemAllocAsync_ptsz");
        assert_eq!(cuda.census().host_chunks, 21, "a full budget sends new chunks to the host");
        cuda.write_and_verify(c, MIB, 3);
        let syncs = cuda.census().stream_syncs;
        assert_eq!(free_async(c, std::ptr::null_mut()), 0, "cuMemFreeAsync_ptsz");
        let census = cuda.census();
        assert_eq!(census.stream_syncs, syncs, "an async free does not wait for its stream");
        assert_eq!(census.host_chunks, 21, "its chunk is kept mapped, for reuse");
        let mut again = 0u64;
        assert_eq!(alloc_async(&mut again, MIB, std::ptr::null_mut()), 0, "cuMemAllocAsync_ptsz again");
        assert_eq!((again, cuda.census().host_chunks), (c, 21), "the same size takes it back");
        assert_eq!(free_async(c, std::ptr::null_mut()), 0);
        let sync: unsafe extern "C" fn() -> Code = cuda.get(c"cuCtxSynchronize", 0);
        assert_eq!(sync(), 0);
        assert_eq!(cuda.census().host_chunks, 20, "a synchronization gives it back, as the driver's pool does");

        assert_eq!(alloc(&mut d, 0), 1, "zero bytes: the driver's CUDA_ERROR_INVALID_VALUE");
        let syncs = cuda.census().context_syncs;
        assert_eq!(free(b), 0, "free");
        assert_eq!(cuda.census().context_syncs, syncs + 1, "a free waits for the context");
        assert_eq!(free(b), 1, "a second free: the driver's CUDA_ERROR_INVALID_VALUE");
        assert_eq!(free(0xdead_0000), 1, "a pointer never allocated: the driver's error");
        assert_eq!(cuda.mem_info().0, 60 * MIB, "the freed chunks are the budget's again");

        assert_eq!(alloc_pitch(&mut d, &mut pitch, 1000, 3, 4), 0, "cuMemAllocPitch_v2");
        assert_eq!(pitch, 1024);
        cuda.write_and_verify(d, pitch * 3, 4);
        assert_eq!(alloc_pitch(&mut d, &mut pitch, 1000, 3, 3), 1, "a bad element size: the driver's answer");
        assert_eq!(free(d), 0);

        assert_eq!(alloc_managed(&mut m, 4096, 1), 0, "managed memory passes through");
        assert_eq!(cuda.census().plain, before.plain + 1, "the driver made it");
        cuda.write_and_verify(m, 4096, 5);
        assert_eq!(free(m), 0);
        cuda.write_and_verify(a, 3 * MIB, 6);
        assert_eq!(free(a), 0);
    }
    assert_eq!(cuda.mem_info(), (64 * MIB, 64 * MIB));
    let after = cuda.census();
    assert_eq!(
        after.held(),
        Census { gpu_chunks: 0, host_chunks: 0, reservations: 0, mappings: 0, ..before }.held(),
        "leak"
    );
    println!("memory: ok");
}

/// Small allocations (at most half a chunk) that fit the budget of 64 MiB are the driver's own,
/// counted against the budget; one that does not fit takes a chunk on the host.
fn small() {
    let cuda = Cuda::load();
    cuda.start();
    let alloc: Alloc = cuda.get(c"cuMemAlloc", 0);
    let free: Free = cuda.get(c"cuMemFree", 0);
    let before = cuda.census();
    const N: usize = 1000;
    let mut ptrs = vec![0u64; N];
    // SAFETY: the driver's (tiermem's) functions with valid out-pointers, and pointers they gave.
    unsafe {
        for p in ptrs.iter_mut() {
            assert_eq!(alloc(p, 4096), 0, "4 KiB");
        }
        let census = cuda.census();
        assert_eq!(census.plain, before.plain + N, "the driver made every small one");
        assert_eq!((census.gpu_chunks, census.host_chunks), (0, 0), "no chunk for a small allocation");
        assert_eq!(cuda.mem_info().0, 64 * MIB - N * 4096, "each counted against the budget");
        for (i, &p) in ptrs.iter().enumerate().step_by(97) {
            cuda.write_and_verify(p, 4096, i as u8);
        }
        for &p in &ptrs {
            assert_eq!(free(p), 0);
        }
        assert_eq!(free(ptrs[0]), 1, "a second free: the driver's error");
        assert_eq!(cuda.mem_info(), (64 * MIB, 64 * MIB), "the budget is whole again");

        let (mut big, mut late) = (0u64, 0u64);
        assert_eq!(alloc(&mut big, 64 * MIB), 0, "the whole budget in chunks");
        assert_eq!(alloc(&mut late, 1000), 0, "1000 B that no longer fit");
        assert_eq!(cuda.census().host_chunks, 1, "take a chunk on the host");
        cuda.write_and_verify(late, 1000, 7);
        assert_eq!(free(late), 0);
        assert_eq!(free(big), 0);
    }
    let after = cuda.census();
    assert_eq!(after.held(), before.held(), "leak");
    println!("small: ok");
}

/// NVML's memory queries, taken by dlsym as pynvml does, are tiermem's: NVML's own numbers
/// before tiermem has seen the GPU, the budget's (64 MiB) once it manages it.
fn nvml() {
    type Init = unsafe extern "C" fn() -> c_int;
    type Handle = unsafe extern "C" fn(c_uint, *mut *mut c_void) -> c_int;
    type Info = unsafe extern "C" fn(*mut c_void, *mut [u64; 3]) -> c_int;
    type InfoV2 = unsafe extern "C" fn(*mut c_void, *mut [u64; 5]) -> c_int;
    // SAFETY: dlopen of a library name, kept for the life of the process.
    let nvml = unsafe { libc::dlopen(c"libnvidia-ml.so.1".as_ptr(), libc::RTLD_NOW) };
    assert!(!nvml.is_null(), "dlopen(libnvidia-ml.so.1) failed");
    let info_ptr = Cuda::dlsym(nvml, c"nvmlDeviceGetMemoryInfo");
    assert_tiermem(info_ptr, "dlsym(libnvidia-ml, nvmlDeviceGetMemoryInfo)");
    assert_tiermem(Cuda::dlsym(nvml, c"nvmlDeviceGetMemoryInfo_v2"), "dlsym(libnvidia-ml, nvmlDeviceGetMemoryInfo_v2)");
    assert_driver(Cuda::dlsym(nvml, c"nvmlDeviceGetHandleByIndex_v2"), "nvmlDeviceGetHandleByIndex_v2");
    // SAFETY: the functions have these signatures (nvml.h); pointers from dlsym.
    let (init, handle, info, info_v2) = unsafe {
        (
            std::mem::transmute::<*mut c_void, Init>(Cuda::dlsym(nvml, c"nvmlInit_v2")),
            std::mem::transmute::<*mut c_void, Handle>(Cuda::dlsym(nvml, c"nvmlDeviceGetHandleByIndex_v2")),
            std::mem::transmute::<*mut c_void, Info>(info_ptr),
            std::mem::transmute::<*mut c_void, InfoV2>(Cuda::dlsym(nvml, c"nvmlDeviceGetMemoryInfo_v2")),
        )
    };
    let mut device = std::ptr::null_mut();
    let (mut memory, mut memory_v2) = ([0u64; 3], [2u64 << 24, 0, 0, 0, 0]);
    // SAFETY: NVML's functions with valid out-pointers.
    unsafe {
        assert_eq!(init(), 0);
        assert_eq!(handle(0, &mut device), 0);
        assert_eq!(info(device, &mut memory), 0);
    }
    assert_eq!(memory[0], 256 * MIB as u64, "before tiermem has seen the GPU: NVML's own total");

    let cuda = Cuda::load();
    cuda.start();
    let alloc: Alloc = cuda.get(c"cuMemAlloc", 0);
    let free: Free = cuda.get(c"cuMemFree", 0);
    let mut a = 0u64;
    // SAFETY: as in `memory`, and NVML's functions with valid out-pointers.
    unsafe {
        assert_eq!(alloc(&mut a, 4 * MIB), 0);
        assert_eq!(info(device, &mut memory), 0);
        assert_eq!(memory, [64 * MIB as u64, 60 * MIB as u64, 4 * MIB as u64], "total, free, used: the budget's");
        assert_eq!(info_v2(device, &mut memory_v2), 0);
        let [_, total, _, free_v2, used] = memory_v2;
        assert_eq!((total, free_v2, used), (64 * MIB as u64, 60 * MIB as u64, 4 * MIB as u64), "v2 too");
        assert_eq!(free(a), 0);
        assert_eq!(info(device, &mut memory), 0);
    }
    assert_eq!(memory, [64 * MIB as u64, 64 * MIB as u64, 0], "freed");
    println!("nvml: ok");
}

fn no_host_chunks() {
    let cuda = Cuda::load();
    cuda.start();
    let alloc: Alloc = cuda.get(c"cuMemAlloc", 0);
    let free: Free = cuda.get(c"cuMemFree", 0);
    let (mut a, mut b) = (0u64, 0u64);
    // SAFETY: as in `memory`.
    unsafe {
        assert_eq!(alloc(&mut a, 4 * MIB), 0, "within the budget");
        let census = cuda.census();
        assert_eq!(alloc(&mut b, 8 * MIB), 2, "beyond the budget without host chunks: CUDA_ERROR_OUT_OF_MEMORY");
        assert_eq!(cuda.census().held(), census.held(), "the refused allocation left nothing behind");
        assert_eq!(cuda.mem_info(), (4 * MIB, 8 * MIB));
        cuda.write_and_verify(a, 4 * MIB, 7);
        assert_eq!(free(a), 0);
    }
    assert_eq!((cuda.census().gpu_chunks, cuda.census().reservations), (0, 0), "leak");
    println!("no-host-chunks: ok");
}

fn gpu_full() {
    type Hold = extern "C" fn(std::ffi::c_int, isize) -> Code;
    let cuda = Cuda::load();
    cuda.start();
    let alloc: Alloc = cuda.get(c"cuMemAlloc", 0);
    let free: Free = cuda.get(c"cuMemFree", 0);
    // Another program holds 56 MiB of the GPU's 64: 8 are left, under a budget of 64.
    let hold: Hold = cuda.fake(c"tiermem_fake_hold");
    assert_eq!(hold(0, 56 * MIB as isize), 0);
    let before = cuda.census();
    let mut ptr = 0;
    // SAFETY: as in `memory`.
    unsafe {
        assert_eq!(alloc(&mut ptr, 20 * MIB), 0, "20 MiB on a GPU with 8 MiB left");
        let census = cuda.census();
        assert_eq!((census.gpu_chunks, census.host_chunks), (4, 6), "the GPU's 8 MiB, then the host");
        cuda.write_and_verify(ptr, 20 * MIB, 8);
        assert_eq!(cuda.mem_info().0, 56 * MIB, "only the chunks in HBM count against the budget");
        assert_eq!(free(ptr), 0);
    }
    assert_eq!(cuda.census().held(), before.held(), "leak");
    assert_eq!(hold(0, -(56 * MIB as isize)), 0);
    println!("gpu-full: ok");
}

fn threads() {
    let cuda = Cuda::load();
    cuda.start();
    let before = cuda.census();
    std::thread::scope(|scope| {
        for thread in 0..4u8 {
            let cuda = &cuda;
            scope.spawn(move || {
                cuda.start(); // this thread's current context
                let alloc: Alloc = cuda.get(c"cuMemAlloc", 0);
                let free: Free = cuda.get(c"cuMemFree", 0);
                for round in 0..10u8 {
                    // 1 to 8 MiB less a little, two held at once: 4 threads want up to 64 MiB.
                    let size =
                        |k: usize| (usize::from(thread) * 3 + usize::from(round) * 5 + k) % 8 * MIB + MIB - k * 999;
                    let (mut first, mut second) = (0, 0);
                    // SAFETY: valid out-pointers; the pointers freed are the ones allocated.
                    unsafe {
                        assert_eq!(alloc(&mut first, size(0)), 0, "thread {thread} round {round}");
                        assert_eq!(alloc(&mut second, size(1)), 0, "thread {thread} round {round}");
                        cuda.write_and_verify(first, size(0), thread.wrapping_mul(50).wrapping_add(round));
                        cuda.write_and_verify(second, size(1), thread.wrapping_mul(70).wrapping_add(round));
                        assert_eq!(free(first), 0, "thread {thread} round {round}");
                        assert_eq!(free(second), 0, "thread {thread} round {round}");
                    }
                }
            });
        }
    });
    assert_eq!(cuda.mem_info(), (16 * MIB, 16 * MIB), "the whole budget is free again");
    assert_eq!(cuda.census().held(), before.held(), "leak");
    println!("threads: ok");
}

fn budget(expected: usize) {
    let cuda = Cuda::load();
    cuda.start();
    assert_eq!(cuda.mem_info(), (expected, expected), "the default budget");
    println!("budget: ok");
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["routing"] => routing::routing(),
        ["memory"] => memory(),
        ["small"] => small(),
        ["nvml"] => nvml(),
        ["no-host-chunks"] => no_host_chunks(),
        ["budget", bytes] => budget(bytes.parse().expect("budget BYTES")),
        ["threads"] => threads(),
        ["gpu-full"] => gpu_full(),
        ["migrate"] => migration::migrate(),
        ["migrate-uneven"] => migration::migrate_uneven(),
        ["migrate-unsynchronized"] => migration::migrate_unsynchronized(),
        ["migrate-fail", call, nth] => migration::migrate_fail(call, nth.parse().expect("migrate-fail CALL N"), 3),
        ["migrate-fail", call, nth, moved] => migration::migrate_fail(
            call,
            nth.parse().expect("migrate-fail CALL N MOVED"),
            moved.parse().expect("migrate-fail CALL N MOVED"),
        ),
        ["migrate-threads"] => migration::threads(),
        ["migrate-capture"] => migration::capture(),
        ["graphs"] => graphs::graph_replays(false),
        ["graphs", "eager"] => graphs::graph_replays(true),
        ["stream-writes"] => stream_ops::stream_writes(),
        ["reset"] => reset::reset(),
        ["contexts"] => reset::contexts(),
        ["contexts-threads"] => reset::contexts_threads(),
        ["segments"] => segments::segments(false),
        ["segments-alternate"] => segments::segments(true),
        ["segments-async"] => segments::segments_async(),
        ["segments-trial"] => segments::segments_trial(),
        ["lease"] => lease::lease(),
        ["ipc"] => ipc::ipc(),
        ["retain"] => ipc::retain(),
        ["ranges"] => ipc::ranges(),
        ["free-async"] => frees::free_async(),
        ["torch-allocator"] => frees::torch_allocator(),
        ["torch-graphs"] => frees::torch_graphs(),
        ["pools"] => pools::pools(),
        ["neighbours"] => neighbours::neighbours(),
        ["neighbours-reclaim"] => neighbours::neighbours_reclaim(),
        ["vmm"] => vmm::vmm(true),
        ["vmm-no-host"] => vmm::vmm(false),
        ["vmm-room"] => vmm::room(),
        ["vmm-off"] => vmm::off(),
        ["ipc-open", handle, len, expect] => ipc::open(handle, len.parse().expect("LEN"), expect, None),
        ["ipc-open", handle, len, expect, write] => {
            ipc::open(handle, len.parse().expect("LEN"), expect, Some(write.parse().expect("WRITE")))
        }
        _ => {
            eprintln!(
                "usage: tiermem-preload-probe routing | memory | no-host-chunks | budget BYTES | threads | gpu-full \
                 | migrate | migrate-uneven | migrate-unsynchronized | migrate-fail CALL N [MOVED] | migrate-threads \
                 | migrate-capture | stream-writes | reset | contexts | contexts-threads | segments | segments-alternate | segments-async | segments-trial | lease | ipc | retain | ranges | free-async | torch-allocator | pools | neighbours | neighbours-reclaim | vmm | vmm-no-host | vmm-room | vmm-off"
            );
            std::process::exit(2);
        }
    }
}
