//! The probe's check of memory pools (`pools`), under a budget of 16 MiB: allocations from the
//! GPU's default pool are tiermem's (in chunks, under the budget, beyond it on the host, freed in
//! stream order, kept across synchronizations up to the release threshold set on the pool, the
//! oldest given back first when an allocation does not fit, and all by `cuMemPoolTrimTo`); so
//! are a pool's the program created with plain properties (pinned memory of the GPU, nothing
//! shareable), with its own release threshold and trims, and `cuMemAllocAsync`'s while it is
//! current; a pool created with other properties (shareable handles) is the driver's, and so is
//! `cuMemAllocAsync` while such a pool is current to the GPU.

use std::ffi::{c_int, c_void};

use super::{AllocAsync, Census, Code, Cuda, FreeAsync, MIB, PER_THREAD};

type AllocFromPool = unsafe extern "C" fn(*mut u64, usize, *mut c_void, *mut c_void) -> Code;
type GetPool = unsafe extern "C" fn(*mut *mut c_void, c_int) -> Code;
type SetPool = unsafe extern "C" fn(c_int, *mut c_void) -> Code;
type PoolCreate = unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> Code;
type PoolDestroy = unsafe extern "C" fn(*mut c_void) -> Code;
type TrimTo = unsafe extern "C" fn(*mut c_void, usize) -> Code;
type SetAttribute = unsafe extern "C" fn(*mut c_void, c_int, *mut c_void) -> Code;
type GetAttribute = unsafe extern "C" fn(*mut c_void, c_int, *mut c_void) -> Code;

/// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`, then `RESERVED_MEM_CURRENT`, `…_HIGH`, `USED_MEM_CURRENT`, `…_HIGH`.
const RELEASE_THRESHOLD: c_int = 4;
const STATISTICS: [c_int; 4] = [5, 6, 7, 8];

/// A pool's four statistics: (reserved, its peak, used, its peak), in MiB.
fn statistics(get: GetAttribute, pool: *mut c_void) -> [u64; 4] {
    STATISTICS.map(|attribute| {
        let mut value = 0u64;
        // SAFETY: a valid out-pointer for a cuuint64_t.
        assert_eq!(unsafe { get(pool, attribute, (&raw mut value).cast()) }, 0, "cuMemPoolGetAttribute({attribute})");
        value / MIB as u64
    })
}

/// A `CUmemPoolProps` of pinned memory on GPU `device` with `handle_types` (88 bytes).
fn pool_props(handle_types: i32, device: i32) -> [u8; 88] {
    let mut props = [0u8; 88];
    for (at, value) in [(0, 1), (4, handle_types), (8, 1), (12, device)] {
        props[at..at + 4].copy_from_slice(&i32::to_ne_bytes(value));
    }
    props
}

/// (GPU chunks, host chunks, the driver's own allocations).
fn held(cuda: &Cuda) -> (usize, usize, usize) {
    let Census { gpu_chunks, host_chunks, plain, .. } = cuda.census();
    (gpu_chunks, host_chunks, plain)
}

pub fn pools() {
    let cuda = Cuda::load();
    cuda.start();
    let before = cuda.census();
    let from_pool: AllocFromPool = cuda.get(c"cuMemAllocFromPoolAsync", 0);
    let from_pool_ptsz: AllocFromPool = cuda.get(c"cuMemAllocFromPoolAsync", PER_THREAD);
    let default_pool: GetPool = cuda.get(c"cuDeviceGetDefaultMemPool", 0);
    let set_pool: SetPool = cuda.get(c"cuDeviceSetMemPool", 0);
    let create: PoolCreate = cuda.get(c"cuMemPoolCreate", 0);
    let destroy: PoolDestroy = cuda.get(c"cuMemPoolDestroy", 0);
    let trim: TrimTo = cuda.get(c"cuMemPoolTrimTo", 0);
    let set_attribute: SetAttribute = cuda.get(c"cuMemPoolSetAttribute", 0);
    let get_attribute: GetAttribute = cuda.get(c"cuMemPoolGetAttribute", 0);
    let sync: unsafe extern "C" fn() -> Code = cuda.get(c"cuCtxSynchronize", 0);
    let alloc_async: AllocAsync = cuda.get(c"cuMemAllocAsync", 0);
    let free_async: FreeAsync = cuda.get(c"cuMemFreeAsync", 0);
    let trims: unsafe extern "C" fn() -> usize = cuda.fake(c"tiermem_fake_pool_trims");
    let (stream, other) = (std::ptr::null_mut(), 0x5eed as *mut c_void);
    let (mut default, mut own) = (std::ptr::null_mut(), std::ptr::null_mut());
    let (mut a, mut b, mut c, mut d, mut e) = (0u64, 0u64, 0u64, 0u64, 0u64);
    // SAFETY: valid out-pointers, handles the driver gave, and pointers the allocations gave.
    unsafe {
        assert_eq!(default_pool(&mut default, 0), 0, "cuDeviceGetDefaultMemPool");
        assert_eq!(from_pool(&mut a, 4 * MIB, default, stream), 0, "cuMemAllocFromPoolAsync");
        assert_eq!(held(&cuda), (2, 0, 0), "the default pool's allocation is tiermem's: two chunks");
        cuda.write_and_verify(a, 4 * MIB, 3);
        assert_eq!(from_pool_ptsz(&mut b, 16 * MIB, default, stream), 0, "cuMemAllocFromPoolAsync_ptsz");
        assert_eq!(held(&cuda), (8, 2, 0), "under the budget: what does not fit lives on the host");
        cuda.write_and_verify(b, 16 * MIB, 4);
        cuda.verify(a, 4 * MIB, 3);
        assert_eq!(statistics(get_attribute, default), [20, 20, 20, 20], "the pool's statistics count tiermem's");
        assert_eq!(free_async(b, stream), 0);
        assert_eq!(free_async(a, stream), 0);
        assert_eq!(held(&cuda).0, 8, "freed in stream order, kept until done with");
        assert_eq!(statistics(get_attribute, default), [20, 20, 0, 20], "kept frees: reserved, not used");
        let driver_trims = trims();
        assert_eq!(trim(default, 0), 0, "cuMemPoolTrimTo");
        assert_eq!(held(&cuda), (0, 0, 0), "trimming the default pool gives tiermem's kept frees back");
        assert_eq!(trims(), driver_trims + 1, "and the driver's pool is trimmed too");
        let mut zero = 0u64;
        assert_eq!(set_attribute(default, STATISTICS[1], (&raw mut zero).cast()), 0, "the reserved peak reset");
        assert_eq!(set_attribute(default, STATISTICS[3], (&raw mut zero).cast()), 0, "the used peak reset");
        assert_eq!(statistics(get_attribute, default), [0, 0, 0, 0], "the peaks start again from now");

        // A release threshold keeps freed memory across synchronizations, as the driver's pool.
        let mut threshold: u64 = 8 * MIB as u64;
        assert_eq!(set_attribute(default, RELEASE_THRESHOLD, (&raw mut threshold).cast()), 0);
        assert_eq!(from_pool(&mut a, 4 * MIB, default, stream), 0);
        assert_eq!(alloc_async(&mut b, 6 * MIB, stream), 0);
        assert_eq!(alloc_async(&mut c, 4 * MIB, stream), 0);
        cuda.write_and_verify(a, 4 * MIB, 6);
        for ptr in [a, b, c] {
            assert_eq!(free_async(ptr, stream), 0);
        }
        assert_eq!(sync(), 0, "cuCtxSynchronize");
        assert_eq!(held(&cuda).0, 4, "the newest frees up to 8 MiB stay: c (4 MiB), not b (6), a (4)");
        assert_eq!(alloc_async(&mut d, 4 * MIB, other), 0);
        assert_eq!(d, a, "a kept free comes back at its address, on any stream once done with, oldest first");
        cuda.verify(d, 4 * MIB, 6);
        assert_eq!(free_async(d, stream), 0);
        threshold = 0;
        assert_eq!(set_attribute(default, RELEASE_THRESHOLD, (&raw mut threshold).cast()), 0);
        assert_eq!(sync(), 0);
        assert_eq!(held(&cuda), (0, 0, 0), "a threshold of 0: given back at the synchronization");

        // An allocation that does not fit gives back the oldest kept frees, only as many as it needs.
        threshold = u64::MAX;
        assert_eq!(set_attribute(default, RELEASE_THRESHOLD, (&raw mut threshold).cast()), 0);
        let mut kept = [0u64; 3];
        for ptr in &mut kept {
            assert_eq!(alloc_async(ptr, 4 * MIB, stream), 0);
        }
        for ptr in kept {
            assert_eq!(free_async(ptr, stream), 0);
        }
        assert_eq!(alloc_async(&mut e, 8 * MIB, stream), 0, "12 MiB kept + 8 do not fit 16");
        assert_eq!(held(&cuda), (8, 0, 0), "the oldest kept free went, the two others stay: all in HBM");
        assert_eq!(alloc_async(&mut d, 4 * MIB, other), 0);
        assert_eq!(d, kept[1], "the oldest of those left comes back first");
        for ptr in [d, e] {
            assert_eq!(free_async(ptr, stream), 0);
        }
        threshold = 0;
        assert_eq!(set_attribute(default, RELEASE_THRESHOLD, (&raw mut threshold).cast()), 0);
        assert_eq!(sync(), 0);
        assert_eq!(held(&cuda), (0, 0, 0));

        // A pool the program creates with plain properties (RAPIDS' async resource makes one).
        let mut plain_pool = std::ptr::null_mut();
        assert_eq!(create(&mut plain_pool, pool_props(0, 0).as_ptr().cast()), 0, "cuMemPoolCreate");
        assert_eq!(from_pool(&mut c, 4 * MIB, plain_pool, stream), 0);
        assert_eq!(held(&cuda), (2, 0, 0), "a plain pool of the program's is served by tiermem: two chunks");
        assert_eq!(cuda.mem_info().0, 12 * MIB, "counted against the budget");
        cuda.write_and_verify(c, 4 * MIB, 7);
        threshold = 8 * MIB as u64;
        assert_eq!(set_attribute(plain_pool, RELEASE_THRESHOLD, (&raw mut threshold).cast()), 0);
        assert_eq!(free_async(c, stream), 0);
        assert_eq!(sync(), 0);
        assert_eq!(held(&cuda).0, 2, "kept across the synchronization: its own release threshold");
        assert_eq!(trim(plain_pool, 0), 0);
        assert_eq!(held(&cuda), (0, 0, 0), "given back by its trim");
        assert_eq!(set_pool(0, plain_pool), 0, "cuDeviceSetMemPool");
        assert_eq!(alloc_async(&mut d, 20 * MIB, stream), 0);
        assert_eq!(
            held(&cuda),
            (8, 2, 0),
            "cuMemAllocAsync while it is current: tiermem's, beyond the budget on the host"
        );
        cuda.write_and_verify(d, 20 * MIB, 8);
        assert_eq!(free_async(d, stream), 0);
        assert_eq!(set_pool(0, default), 0);
        assert_eq!(trim(plain_pool, 0), 0);
        assert_eq!(destroy(plain_pool), 0, "cuMemPoolDestroy");
        assert_eq!(held(&cuda), (0, 0, 0));

        assert_eq!(create(&mut own, pool_props(1, 0).as_ptr().cast()), 0, "cuMemPoolCreate, shareable");
        assert_eq!(from_pool(&mut c, 4 * MIB, own, stream), 0);
        assert_eq!(held(&cuda), (0, 0, 1), "a pool with shareable handles is the driver's");
        assert_eq!(cuda.mem_info(), (16 * MIB, 16 * MIB), "not counted against the budget");
        cuda.write_and_verify(c, 4 * MIB, 5);
        assert_eq!(set_pool(0, own), 0, "cuDeviceSetMemPool");
        assert_eq!(alloc_async(&mut d, 4 * MIB, stream), 0);
        assert_eq!(held(&cuda), (0, 0, 2), "cuMemAllocAsync while the program's pool is current: the driver's");
        assert_eq!(set_pool(0, default), 0);
        assert_eq!(alloc_async(&mut e, 4 * MIB, stream), 0);
        assert_eq!(held(&cuda), (2, 0, 2), "the default pool current again: tiermem's");
        for ptr in [c, d, e] {
            assert_eq!(free_async(ptr, stream), 0);
        }
        assert_eq!(trim(default, 0), 0);
        assert_eq!(destroy(own), 0, "cuMemPoolDestroy");
        assert_eq!(
            from_pool(&mut a, 4 * MIB, own, stream),
            1,
            "a destroyed pool: the driver's CUDA_ERROR_INVALID_VALUE"
        );
        // Bad input gets the driver's own answers, and nothing is held.
        assert_eq!(from_pool(std::ptr::null_mut(), 4 * MIB, default, stream), 1, "a null out-pointer");
        assert_eq!(from_pool(&mut a, 4 * MIB, 0xbad as *mut c_void, stream), 1, "a pool that never was");
        assert_eq!(trim(0xbad as *mut c_void, 0), 1, "trimming a pool that never was");
        let mut threshold = 0u64;
        assert_eq!(set_attribute(0xbad as *mut c_void, RELEASE_THRESHOLD, (&raw mut threshold).cast()), 1);
    }
    assert_eq!(cuda.census().held(), before.held(), "leak");
    println!("pools: ok");
}
