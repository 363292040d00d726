//! The probe's migration checks (stage 2), under a budget of 16 MiB over the fake driver, whose
//! kernels dereference the pointers they are given (crates/fakecuda/src/kernel.rs): a launch
//! that reaches a chunk while it is unmapped fails with `CUDA_ERROR_ILLEGAL_ADDRESS`, and a
//! kernel that writes adds one to each word its pointers name.

use std::ffi::{c_int, c_uint, c_void, CString};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use super::{Alloc, Census, Code, Cuda, Free, GetInfo, MIB, PER_THREAD};

type Launch = unsafe extern "C" fn(
    *mut c_void,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> Code;
pub type Sync = unsafe extern "C" fn() -> Code;
type Register = unsafe extern "C" fn(*mut c_void, *const usize, usize, c_int) -> Code;
type Location = extern "C" fn(u64) -> c_int;
type Fail = unsafe extern "C" fn(*const std::ffi::c_char, usize) -> Code;

/// Kernels: one that reads two pointers and a 4-byte scalar; one that takes a 64-byte struct
/// of addresses (as PyTorch's multi_tensor_apply does), which only tiermem's scan sees; one
/// that writes through one pointer.
pub const READS: usize = 0x1000;
const TAKES_STRUCT: usize = 0x2000;
pub const WRITES: usize = 0x3000;
/// A library kernel (a `CUkernel`, as the CUDA runtime launches its own): its parameters only
/// `cuKernelGetParamInfo` answers, and its pointer is its second parameter.
pub const LIBRARY: usize = 0x4000;
pub const CHUNK: usize = 2 * MIB;

pub struct Kernels {
    launch: Launch,
}

impl Kernels {
    pub fn register(cuda: &Cuda) -> Kernels {
        let register: Register = cuda.fake(c"tiermem_fake_kernel");
        // SAFETY: the fake's registration with arrays of the counts given.
        unsafe {
            assert_eq!(register(READS as *mut c_void, [8usize, 8, 4].as_ptr(), 3, 0), 0);
            assert_eq!(register(TAKES_STRUCT as *mut c_void, [64usize].as_ptr(), 1, 0), 0);
            assert_eq!(register(WRITES as *mut c_void, [8usize].as_ptr(), 1, 1), 0);
            assert_eq!(register(LIBRARY as *mut c_void, [4usize, 8].as_ptr(), 2, 2), 0);
        }
        Kernels { launch: cuda.get(c"cuLaunchKernel", PER_THREAD) }
    }

    /// Launches `kernel` with 8-byte parameter values `args` (each passed by address, as CUDA does).
    pub fn launch(&self, kernel: usize, args: &mut [*mut c_void]) -> Code {
        self.launch_on(kernel, args, std::ptr::null_mut())
    }

    /// [`Kernels::launch`] on `stream`.
    pub fn launch_on(&self, kernel: usize, args: &mut [*mut c_void], stream: *mut c_void) -> Code {
        let mut params = args.iter_mut().map(|a| (a as *mut *mut c_void).cast::<c_void>()).collect::<Vec<_>>();
        self.launch_full(kernel, &mut params, stream)
    }

    /// Launches `kernel` with `params`: one pointer per parameter, to its value.
    fn launch_with(&self, kernel: usize, params: &mut [*mut c_void]) -> Code {
        self.launch_full(kernel, params, std::ptr::null_mut())
    }

    fn launch_full(&self, kernel: usize, params: &mut [*mut c_void], stream: *mut c_void) -> Code {
        let (grid, extra) = (1, std::ptr::null_mut());
        // SAFETY: `params` holds one pointer per parameter of `kernel`, each to a value of the
        // size the kernel was registered with (the callers build them so).
        unsafe { (self.launch)(kernel as *mut c_void, grid, 1, 1, 1, 1, 1, 0, stream, params.as_mut_ptr(), extra) }
    }
}

/// Where each chunk of `len` bytes at `ptr` lives: 1 HBM, 2 host.
pub fn locations(cuda: &Cuda, ptr: u64, len: usize) -> Vec<c_int> {
    let location: Location = cuda.fake(c"tiermem_fake_location");
    (0..len / CHUNK).map(|i| location(ptr + (i * CHUNK) as u64)).collect()
}

/// A (16 MiB, fills the budget) and B (8 MiB, on the host) with patterns; B made hot.
pub fn hot_b(cuda: &Cuda, kernels: &Kernels) -> (u64, u64) {
    let alloc: Alloc = cuda.get(c"cuMemAlloc", 0);
    let (mut a, mut b) = (0u64, 0u64);
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(alloc(&mut a, 16 * MIB), 0);
        assert_eq!(alloc(&mut b, 8 * MIB), 0);
    }
    assert_eq!(locations(cuda, a, 16 * MIB), [1; 8], "A fills the budget");
    assert_eq!(locations(cuda, b, 8 * MIB), [2; 4], "B lands on the host");
    cuda.write(a, 16 * MIB, 11);
    cuda.write(b, 8 * MIB, 22);
    let scalar = 7usize as *mut c_void;
    for _ in 0..10 {
        let mut args = [b as *mut c_void, (b + 4 * MIB as u64 + 8) as *mut c_void, scalar];
        assert_eq!(kernels.launch(READS, &mut args), 0, "a launch on B");
    }
    for _ in 0..5 {
        // One parameter of 64 bytes, two of its words addresses in B.
        let mut inside = [0u64; 8];
        (inside[1], inside[5]) = (b + 2 * MIB as u64, b + 6 * MIB as u64);
        let code = kernels.launch_with(TAKES_STRUCT, &mut [inside.as_mut_ptr().cast::<c_void>()]);
        assert_eq!(code, 0, "a launch with B's addresses inside a struct");
    }
    for _ in 0..3 {
        let mut args = [4usize as *mut c_void, (b + MIB as u64) as *mut c_void];
        assert_eq!(kernels.launch(LIBRARY, &mut args), 0, "a library kernel's launch on B");
    }
    (a, b)
}

/// Frees A and B; checks the budget is whole and nothing is held beyond `before`.
pub fn free_all(cuda: &Cuda, ptrs: &[u64], before: &Census) {
    free_all_under(cuda, ptrs, before, 16 * MIB);
}

/// [`free_all`] under a budget of `budget` bytes.
pub fn free_all_under(cuda: &Cuda, ptrs: &[u64], before: &Census, budget: usize) {
    let free: Free = cuda.get(c"cuMemFree", 0);
    for &p in ptrs {
        // SAFETY: pointers the allocation gave.
        assert_eq!(unsafe { free(p) }, 0);
    }
    assert_eq!(cuda.mem_info(), (budget, budget), "the budget is whole again");
    assert_eq!(cuda.census().held(), before.held(), "leak: spare chunks and the scratch range go with the last free");
}

/// Checks A's and B's patterns as [`hot_b`] wrote them, then frees both as [`free_all`] does.
pub fn verify_and_free(cuda: &Cuda, (a, b): (u64, u64), before: &Census) {
    cuda.verify(a, 16 * MIB, 11);
    cuda.verify(b, 8 * MIB, 22);
    free_all(cuda, &[a, b], before);
}

pub fn hbm_in_use(cuda: &Cuda) -> usize {
    let get_info: GetInfo = cuda.get(c"cuMemGetInfo", 0);
    let (mut free, mut total) = (0, 0);
    // SAFETY: valid out-pointers.
    assert_eq!(unsafe { get_info(&mut free, &mut total) }, 0);
    total - free
}

/// The driver started, what it held before, the fake's kernels registered, `cuCtxSynchronize`
/// and `cuMemAlloc`.
pub fn begin() -> (Cuda, Census, Kernels, Sync, Alloc) {
    let cuda = Cuda::load();
    cuda.start();
    let before = cuda.census();
    let kernels = Kernels::register(&cuda);
    let (sync, alloc) = (cuda.get(c"cuCtxSynchronize", 0), cuda.get(c"cuMemAlloc", 0));
    (cuda, before, kernels, sync, alloc)
}

/// The driver started, what it held before, `cuCtxSynchronize`, and A and B as `hot_b` makes them.
fn setup() -> (Cuda, Census, Sync, u64, u64) {
    let (cuda, before, kernels, sync, _) = begin();
    let (a, b) = hot_b(&cuda, &kernels);
    (cuda, before, sync, a, b)
}

pub fn migrate() {
    let (cuda, before, sync, a, b) = setup();
    // SAFETY: the driver's synchronization.
    assert_eq!(unsafe { sync() }, 0);
    let on = std::env::var("TIERMEM_MIGRATE").map_or(true, |v| v != "off");
    let (a_where, b_where) = (locations(&cuda, a, 16 * MIB), locations(&cuda, b, 8 * MIB));
    if on {
        assert_eq!(b_where, [1; 4], "B, hot, came up");
        assert_eq!(a_where, [2, 2, 2, 2, 1, 1, 1, 1], "A's first four chunks, cold, went down");
    } else {
        assert_eq!((a_where, b_where), (vec![1; 8], vec![2; 4]), "TIERMEM_MIGRATE=off: nothing moves");
    }
    assert_eq!(hbm_in_use(&cuda), 16 * MIB, "the books: the budget, exactly");
    assert_eq!(cuda.census().gpu_chunks * CHUNK, 16 * MIB, "and the GPU holds what the books say");
    let peak = cuda.census().peak_used_bytes;
    assert!(peak <= 16 * MIB, "the GPU held {peak} bytes at once mid-move: more than the budget");
    cuda.verify(a, 16 * MIB, 11);
    cuda.verify(b, 8 * MIB, 22);
    // With no launch since, the next quiesce point has no heat: nothing moves back.
    // SAFETY: as above.
    assert_eq!(unsafe { sync() }, 0);
    assert_eq!(locations(&cuda, b, 8 * MIB), if on { [1; 4] } else { [2; 4] }, "no ping-pong");
    free_all(&cuda, &[a, b], &before);
    println!("migrate: ok");
}

/// A program that never synchronizes (`TIERMEM_PAUSE_MS` short): B, hot and on the host, comes
/// up at a pause tiermem makes before a launch, with no synchronization of the program's; A's
/// cold chunks go down for it; every byte intact.
pub fn migrate_unsynchronized() {
    let cuda = Cuda::load();
    cuda.start();
    let before = cuda.census();
    let kernels = Kernels::register(&cuda);
    let (a, b) = hot_b(&cuda, &kernels);
    let started = std::time::Instant::now();
    let patience: u128 = std::env::var("TIERMEM_PROBE_PATIENCE_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(60_000);
    while locations(&cuda, b, 8 * MIB) != [1; 4] {
        assert!(started.elapsed().as_millis() < patience, "B never came up without a synchronization");
        let mut args = [b as *mut c_void, (b + 4 * MIB as u64 + 8) as *mut c_void, 7usize as *mut c_void];
        assert_eq!(kernels.launch(READS, &mut args), 0, "a launch on B");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(locations(&cuda, a, 16 * MIB), [2, 2, 2, 2, 1, 1, 1, 1], "A's cold chunks went down for it");
    assert_eq!(hbm_in_use(&cuda), 16 * MIB, "the budget, exactly");
    verify_and_free(&cuda, (a, b), &before);
    println!("migrate-unsynchronized: ok");
}

/// As [`migrate`] with chunks of 6 MiB (`TIERMEM_CHUNK=6MiB`): A is 6 + 6 + 4 MiB, B 6 + 2;
/// B's two chunks come up for A's first two, whose 12 MiB of HBM leave room for both; each
/// chunk moves whole, its bytes intact, and HBM is counted by the bytes of the chunks in it.
pub fn migrate_uneven() {
    let (cuda, before, sync, a, b) = setup();
    // SAFETY: the driver's synchronization.
    assert_eq!(unsafe { sync() }, 0);
    assert_eq!(locations(&cuda, b, 8 * MIB), [1; 4], "B's 6 and 2 MiB came up");
    assert_eq!(locations(&cuda, a, 16 * MIB), [2, 2, 2, 2, 2, 2, 1, 1], "A's two 6 MiB chunks went down, whole");
    assert_eq!(hbm_in_use(&cuda), 12 * MIB, "A's 4 MiB and B's 8 in HBM");
    assert_eq!(cuda.census().gpu_chunks, 3, "three physical chunks on the GPU: A's last, B's two");
    let peak = cuda.census().peak_used_bytes;
    assert!(peak <= 16 * MIB, "the GPU held {peak} bytes at once mid-move: more than the budget");
    verify_and_free(&cuda, (a, b), &before);
    println!("migrate-uneven: ok");
}

/// While a stream capture is under way nothing moves (a context synchronization would break
/// it); once it ends, the next synchronization moves what the launches heated.
pub fn capture() {
    type Begin = unsafe extern "C" fn(*mut c_void, c_int) -> Code;
    type End = unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> Code;
    let (cuda, before, sync, a, b) = setup();
    let (begin, end): (Begin, End) = (cuda.get(c"cuStreamBeginCapture", 0), cuda.get(c"cuStreamEndCapture", 0));
    let mut graph = std::ptr::null_mut();
    // SAFETY: the driver's capture calls on the legacy stream, a valid out-pointer; its synchronization.
    unsafe {
        assert_eq!(begin(std::ptr::null_mut(), 0), 0);
        assert_eq!(sync(), 0);
        assert_eq!(locations(&cuda, b, 8 * MIB), [2; 4], "no move while a capture is under way");
        assert_eq!(end(std::ptr::null_mut(), &mut graph), 0);
        assert_eq!(sync(), 0);
    }
    assert_eq!(locations(&cuda, b, 8 * MIB), [1; 4], "the capture over, B came up");
    verify_and_free(&cuda, (a, b), &before);
    println!("migrate-capture: ok");
}

/// The `nth` call of `call` fails mid-migration: the moves it belongs to (one, or a run of
/// neighbouring chunks given access in one call) leave their chunks where they were, every
/// other move completes (`moved` chunks each way), and every byte is intact.
pub fn migrate_fail(call: &str, nth: usize, moved: usize) {
    let (cuda, before, sync, a, b) = setup();
    let fail: Fail = cuda.fake(c"tiermem_fake_fail");
    let name = CString::new(call).expect("a call name");
    // SAFETY: the fake's injection with a NUL-terminated name; the driver's synchronization.
    unsafe {
        assert_eq!(fail(name.as_ptr(), nth), 0);
        assert_eq!(sync(), 0, "a failed move is tiermem's business, not the program's");
    }
    let up = locations(&cuda, b, 8 * MIB).iter().filter(|&&l| l == 1).count();
    let down = locations(&cuda, a, 16 * MIB).iter().filter(|&&l| l == 2).count();
    println!("migrate-fail {call} {nth}: {up} chunks of B up, {down} of A down");
    assert_eq!((up, down), (moved, moved), "each move down that failed left a move up no room");
    assert_eq!(hbm_in_use(&cuda), 16 * MIB, "the books: the budget, exactly");
    assert_eq!(cuda.census().gpu_chunks * CHUNK, 16 * MIB, "and the GPU holds what the books say");
    let peak = cuda.census().peak_used_bytes;
    assert!(peak <= 16 * MIB, "the GPU held {peak} bytes at once mid-move: more than the budget");
    verify_and_free(&cuda, (a, b), &before);
    println!("migrate-fail: ok");
}

/// A and B, 16 MiB each (A fills the budget, B lands on the host), zeroed.
pub fn zeroed_pair(cuda: &Cuda, alloc: Alloc) -> (u64, u64) {
    let (mut a, mut b) = (0u64, 0u64);
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(alloc(&mut a, 16 * MIB), 0);
        assert_eq!(alloc(&mut b, 16 * MIB), 0);
    }
    cuda.write(a, 16 * MIB, 0);
    cuda.write(b, 16 * MIB, 0);
    (a, b)
}

/// Synchronizes over and over (each a quiesce point), counting each in `syncs`, until `threads`
/// threads are `done`.
pub fn synchronize_until(sync: Sync, done: &AtomicUsize, threads: usize, syncs: &AtomicUsize) {
    while done.load(SeqCst) < threads {
        // SAFETY: the driver's synchronization.
        assert_eq!(unsafe { sync() }, 0);
        syncs.fetch_add(1, SeqCst);
    }
}

/// Counts a thread as done when dropped.
pub struct Done<'a>(pub &'a AtomicUsize);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

/// Three threads launch a writing kernel on words of their own, in B (on the host) and A by turns,
/// while the main thread synchronizes over and over (each a quiesce point, chunks moving both
/// ways); no launch may fault, and no increment may be lost to a copy made under it.
pub fn threads() {
    const LAUNCHES: u64 = 8000;
    let (cuda, before, kernels, sync, alloc) = begin();
    let (a, b) = zeroed_pair(&cuda, alloc);
    let word = |base: u64, t: u64| base + t * 5 * MIB as u64 + 64;
    let start = |base: u64, t: u64| u64::from_le_bytes(cuda.read(word(base, t), 8).try_into().expect("8 bytes"));
    let starts: Vec<(u64, u64)> = (0..3).map(|t| (start(a, t), start(b, t))).collect();
    let (done, syncs) = (AtomicUsize::new(0), AtomicUsize::new(0));
    std::thread::scope(|scope| {
        for t in 0..3u64 {
            let (kernels, done, syncs, word) = (&kernels, &done, &syncs, &word);
            let cuda = &cuda;
            scope.spawn(move || {
                // Counted even if an assertion fails, so that the main thread stops waiting.
                let _done = Done(done);
                cuda.start();
                for i in 0..LAUNCHES {
                    if i % 250 == 0 {
                        // A new phase starts after two quiesce points, however busy the machine:
                        // the next ones find this phase's heat and move chunks while it launches.
                        let seen = syncs.load(SeqCst);
                        while syncs.load(SeqCst) < seen + 2 {
                            std::thread::yield_now();
                        }
                    }
                    // B and A by turns, so that chunks keep moving both ways.
                    let target = if (i / 250) % 2 == 0 { word(b, t) } else { word(a, t) };
                    let code = kernels.launch(WRITES, &mut [target as *mut c_void]);
                    assert_eq!(code, 0, "thread {t} launch {i}: a fault means a chunk was remapped under it");
                }
            });
        }
        synchronize_until(sync, &done, 3, &syncs);
    });
    for (t, &(from_a, from_b)) in starts.iter().enumerate() {
        let t = t as u64;
        assert_eq!(start(b, t) - from_b, LAUNCHES / 2, "thread {t}'s increments in B");
        assert_eq!(start(a, t) - from_a, LAUNCHES / 2, "thread {t}'s increments in A");
    }
    assert_eq!(hbm_in_use(&cuda), 16 * MIB);
    free_all(&cuda, &[a, b], &before);
    println!("migrate-threads: ok");
}
