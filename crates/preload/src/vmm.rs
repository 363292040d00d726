//! The program's own VMM memory: physical allocations it makes with `cuMemCreate` and maps
//! itself — PyTorch's caching allocator with `expandable_segments:True` (which its own
//! out-of-memory message recommends), vLLM's `CuMemAllocator` (sleep mode), JAX's and others'
//! VMM allocators. Passed through unchanged, they escaped the budget: a program under
//! `--hbm-limit 12GiB` could fill the whole GPU.
//!
//! Now a pinned chunk the program asks for in a GPU's HBM is counted against that GPU's
//! budget while it fits, and beyond it is made in host memory instead (the GPU's NUMA node,
//! `CU_MEM_LOCATION_TYPE_HOST_NUMA`, with every other property as asked): the program maps it
//! and opens it to the GPU as it would have, and its kernels read it over PCIe — slower, never
//! a fault, as with tiermem's own chunks beyond the budget. These chunks never move (the
//! program owns the handle and the mappings), so one made on the host stays there; `cuMemRelease`
//! gives its HBM back to the budget.
//!
//! So before making one on the host, tiermem makes room for it in HBM when its own allocations
//! hold enough there: their coldest chunks go to the host in a pause of tiermem's own
//! (migrate.rs, `shed`), as for a budget the node daemon cut. The program's own chunks are
//! typically made as it runs — PyTorch's segments growing, llama.cpp's compute pool — where
//! the memory tiermem serves was allocated first (weights by `cudaMalloc`), and tiermem's chunks
//! can come back at the next quiesce point while the program's cannot. Not with
//! `TIERMEM_MIGRATE=off`, nor while nothing may move (a stream capture under way).
//!
//! Where host chunks cannot be made (a driver without host VMM, a property host memory cannot
//! have), the chunk is made in HBM as asked and counted beyond the budget. Compressible chunks
//! and chunks of GPUs tiermem does not manage pass through uncounted.
//!
//! `TIERMEM_PROGRAM_VMM` chooses: `host` (the default, as above), `hbm` (counted, but always
//! made in HBM as asked: for chunks that must stay GPU memory, such as NCCL's buffers
//! registered with a network card), `off` (passed through uncounted, as before).

use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

use crate::boundary::{guard, inside, to_driver, CuResult, CUDA_ERROR_NOT_INITIALIZED, CUDA_SUCCESS};
use crate::placement::Tier;
use crate::process;
use crate::wrappers::cached_entry;

/// `CUmemAllocationProp` (cuda.h).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AllocationProp {
    kind: c_int,
    handle_types: c_int,
    location_type: c_int,
    location_id: c_int,
    win32_metadata: *mut c_void,
    compression: u8,
    gpu_direct_rdma: u8,
    usage: u16,
    reserved: [u8; 4],
}

const PINNED: c_int = 1;
const LOCATION_DEVICE: c_int = 1;
const LOCATION_HOST_NUMA: c_int = 3;
const HOST_NUMA_ID: c_int = 134;
const HOST_NUMA_VMM_SUPPORTED: c_int = 141;

type CreateFn = unsafe extern "C" fn(*mut u64, usize, *const AllocationProp, u64) -> CuResult;
type ReleaseFn = unsafe extern "C" fn(u64) -> CuResult;
type AttributeFn = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> CuResult;

/// The program's chunks tiermem counts: handle → (GPU, bytes, where it was made).
static CHUNKS: Mutex<BTreeMap<u64, (usize, usize, Tier)>> = Mutex::new(BTreeMap::new());
/// Bytes made in HBM and on the host so far, for `--stats`.
static MADE_HBM: AtomicUsize = AtomicUsize::new(0);
static MADE_HOST: AtomicUsize = AtomicUsize::new(0);
/// Bytes of those made in HBM for which tiermem sent its own chunks to the host ([`make_room`]).
static ROOM_MADE: AtomicUsize = AtomicUsize::new(0);

fn chunks() -> std::sync::MutexGuard<'static, BTreeMap<u64, (usize, usize, Tier)>> {
    CHUNKS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The `--stats` line, if the program made VMM chunks of its own.
pub fn report() -> Option<String> {
    let (hbm, host) = (MADE_HBM.load(Relaxed), MADE_HOST.load(Relaxed));
    let room = ROOM_MADE.load(Relaxed);
    (hbm + host > 0).then(|| {
        format!(
            "tiermem: stats: the program's own VMM chunks (cuMemCreate): {} made in HBM ({} of it where tiermem \
             sent chunks of its own to the host to make room), {} on the host beyond the budget",
            tiermem::format_size(hbm),
            tiermem::format_size(room),
            tiermem::format_size(host)
        )
    })
}

/// What becomes of the program's chunks (`TIERMEM_PROGRAM_VMM`, module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Host,
    Hbm,
    Off,
}

fn mode() -> Mode {
    static MODE: OnceLock<Mode> = OnceLock::new();
    *MODE.get_or_init(|| match std::env::var("TIERMEM_PROGRAM_VMM").as_deref() {
        Ok("hbm") => Mode::Hbm,
        Ok("off") => Mode::Off,
        Ok("host") | Err(_) => Mode::Host,
        Ok(other) => {
            crate::boundary::log(
                "TIERMEM_PROGRAM_VMM",
                &format!("unknown value {other:?}"),
                "using host (host, hbm or off)",
            );
            Mode::Host
        }
    })
}

/// GPU `ordinal`'s host NUMA node, if the driver makes VMM chunks there.
fn host_numa(ordinal: c_int) -> Option<c_int> {
    static ATTRIBUTE: OnceLock<Option<AttributeFn>> = OnceLock::new();
    let get = cached_entry(&ATTRIBUTE, "cuDeviceGetAttribute\0")?;
    let attribute = |which| {
        let mut value = 0;
        // SAFETY: the driver's function with a valid out-pointer.
        (unsafe { get(&mut value, which, ordinal) } == CUDA_SUCCESS).then_some(value)
    };
    (attribute(HOST_NUMA_VMM_SUPPORTED)? != 0).then(|| attribute(HOST_NUMA_ID).unwrap_or(0).max(0))
}

/// `cuMemCreate`: a pinned chunk of a managed GPU's HBM, counted against its budget while it
/// fits, made on the host beyond it (module documentation); anything else, the driver's.
///
/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const AllocationProp,
    flags: u64,
) -> CuResult {
    static REAL: OnceLock<Option<CreateFn>> = OnceLock::new();
    let Some(real) = cached_entry(&REAL, "cuMemCreate\0") else { return CUDA_ERROR_NOT_INITIALIZED };
    // SAFETY: the driver's own function with the caller's arguments.
    let driver = |prop: *const AllocationProp| unsafe { real(handle, size, prop, flags) };
    if inside() || handle.is_null() || prop.is_null() || size == 0 || mode() == Mode::Off {
        return to_driver(|| driver(prop));
    }
    // SAFETY: checked non-null; the caller's allocation description.
    let asked = unsafe { *prop };
    let ordinal = usize::try_from(asked.location_id).ok();
    let counted = asked.kind == PINNED && asked.location_type == LOCATION_DEVICE && asked.compression == 0;
    let Some(ordinal) = ordinal.filter(|_| counted) else { return to_driver(|| driver(prop)) };
    guard("cuMemCreate", || {
        let placed = match mode() == Mode::Host && make_room("cuMemCreate", ordinal, size) {
            true => Some(Tier::Hbm),
            false => process::place_program_chunk("cuMemCreate", ordinal, size),
        };
        let Some(tier) = placed else {
            return to_driver(|| driver(prop));
        };
        let on_host = (tier == Tier::Host && mode() == Mode::Host).then(|| host_numa(asked.location_id)).flatten();
        let made =
            on_host.and_then(|numa| make_on_host(&driver, asked, numa, size)).map(|()| (CUDA_SUCCESS, Tier::Host));
        let (code, tier) = made.unwrap_or_else(|| {
            // In HBM as asked: counted now if it did not fit (beyond the budget).
            if tier == Tier::Host {
                process::count_hbm(ordinal, size);
            }
            (to_driver(|| driver(prop)), Tier::Hbm)
        });
        if code != CUDA_SUCCESS {
            process::uncount_hbm(ordinal, if tier == Tier::Hbm { size } else { 0 });
            return code;
        }
        // SAFETY: checked non-null; the driver wrote the handle it succeeded with.
        chunks().insert(unsafe { *handle }, (ordinal, size, tier));
        match tier {
            Tier::Hbm => MADE_HBM.fetch_add(size, Relaxed),
            Tier::Host => MADE_HOST.fetch_add(size, Relaxed),
        };
        CUDA_SUCCESS
    })
}

/// Makes room in GPU `ordinal`'s budget for a chunk of the program's of `size` bytes that does
/// not fit, by sending tiermem's own coldest chunks to the host (module documentation): whether
/// the chunk is counted in HBM now. Nothing is sent down unless tiermem holds enough there.
fn make_room(call: &str, ordinal: usize, size: usize) -> bool {
    let Some((budget, used)) = process::budget_and_use(ordinal) else { return false };
    if used.saturating_add(size) <= budget || movable_hbm(ordinal) < size {
        return false;
    }
    process::count_hbm(ordinal, size);
    // From a thread of tiermem's own, marked inside tiermem (its driver calls go straight to
    // the driver): the pause makes the GPU's primary context current on it.
    let shed = std::thread::scope(|scope| {
        let inside_tiermem = || {
            let _inside = crate::boundary::enter();
            crate::migrate::shed(call, ordinal)
        };
        scope.spawn(inside_tiermem).join()
    });
    match shed {
        Ok(Ok(())) => {
            ROOM_MADE.fetch_add(size, Relaxed);
            true
        }
        _ => {
            process::uncount_hbm(ordinal, size);
            false
        }
    }
}

/// Bytes tiermem's own allocations hold in GPU `ordinal`'s HBM that may move (not shared).
fn movable_hbm(ordinal: usize) -> usize {
    let p = process::lock();
    p.books.iter().filter(|a| a.ordinal == ordinal && !a.shared).map(|a| a.bytes_on(Tier::Hbm)).sum()
}

/// Makes the chunk the program asked for on host NUMA node `numa` instead of its GPU. Host
/// memory is reachable by RDMA as it is, and the driver refuses host chunks that ask to be
/// GPUDirect RDMA capable (PyTorch's expandable segments ask where the GPU supports it), so
/// that flag is dropped if the chunk cannot be made with it. `None` (said once) if it cannot
/// be made on the host at all.
fn make_on_host(
    driver: &impl Fn(*const AllocationProp) -> CuResult,
    asked: AllocationProp,
    numa: c_int,
    size: usize,
) -> Option<()> {
    let host = AllocationProp { location_type: LOCATION_HOST_NUMA, location_id: numa, ..asked };
    let mut code = to_driver(|| driver(&host));
    if code != CUDA_SUCCESS && host.gpu_direct_rdma != 0 {
        let plain = AllocationProp { gpu_direct_rdma: 0, ..host };
        code = to_driver(|| driver(&plain));
    }
    if code == CUDA_SUCCESS {
        return Some(());
    }
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, Relaxed) {
        crate::boundary::log(
            "cuMemCreate",
            &format!(
                "a chunk of {size} B beyond the budget could not be made in host memory (CUDA error {code}; \
                 handle types {}, RDMA {})",
                asked.handle_types, asked.gpu_direct_rdma
            ),
            "it is made in HBM as asked, beyond the budget (said once)",
        );
    }
    None
}

/// `cuMemRelease`: the driver's; a chunk tiermem counted in HBM gives its bytes back to the
/// budget.
///
/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: u64) -> CuResult {
    static REAL: OnceLock<Option<ReleaseFn>> = OnceLock::new();
    let Some(real) = cached_entry(&REAL, "cuMemRelease\0") else { return CUDA_ERROR_NOT_INITIALIZED };
    // Out of the books before the driver releases it: the driver may hand the handle to
    // another thread's cuMemCreate the moment it is released.
    let taken = if inside() { None } else { chunks().remove(&handle) };
    // SAFETY: the driver's own function with the caller's argument.
    let code = to_driver(|| unsafe { real(handle) });
    match taken {
        Some((ordinal, size, Tier::Hbm)) if code == CUDA_SUCCESS => process::uncount_hbm(ordinal, size),
        Some(entry) if code != CUDA_SUCCESS => {
            chunks().insert(handle, entry);
        }
        _ => {}
    }
    code
}

/// The routed functions of the program's own VMM memory.
pub fn vmm_routes() -> Vec<crate::wrappers::Route> {
    vec![(c"cuMemCreate", cuMemCreate as *mut c_void), (c"cuMemRelease", cuMemRelease as *mut c_void)]
}
