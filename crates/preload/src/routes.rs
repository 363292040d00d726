//! How a program reaches tiermem's entry points instead of the driver's: the one table of
//! routed functions, and the two doors a program gets driver functions through — `dlsym` and
//! `cuGetProcAddress` — both answered by "the real pointer, or tiermem's wrapper of it".
//!
//! The table maps the driver's *real function pointers* (looked up once by versioned name in
//! the loaded libcuda) to tiermem's wrappers. Whatever name, version or stream flavour a
//! program asks for, the driver resolves it first, and tiermem only swaps the answer when it
//! is one of the routed functions. Why that suffices, and a header-generated version table is
//! not needed, is explained in the crate documentation.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::OnceLock;

use crate::boundary::{enter, guard, inside, to_driver, CuResult, CUDA_SUCCESS};
use crate::driver::{self, driver};
use crate::wrappers::Route;
use crate::{contexts, entry, gated, ipc, launch, pointers, pools, reset, vmm};

/// `CUDA_ERROR_NOT_FOUND`: what the driver answers for a symbol it does not have.
const CUDA_ERROR_NOT_FOUND: CuResult = 500;

/// The routed functions: the driver's versioned name and tiermem's function for it.
fn routed() -> Vec<Route> {
    let memory = [
        (c"cuGetProcAddress", cuGetProcAddress as *mut c_void),
        (c"cuGetProcAddress_v2", cuGetProcAddress_v2 as *mut c_void),
        (c"cuMemAlloc_v2", entry::cuMemAlloc_v2 as *mut c_void),
        (c"cuMemAllocPitch_v2", entry::cuMemAllocPitch_v2 as *mut c_void),
        (c"cuMemFree_v2", entry::cuMemFree_v2 as *mut c_void),
        (c"cuMemGetInfo_v2", entry::cuMemGetInfo_v2 as *mut c_void),
        (c"cuMemAllocAsync", entry::cuMemAllocAsync as *mut c_void),
        (c"cuMemAllocAsync_ptsz", entry::cuMemAllocAsync_ptsz as *mut c_void),
        (c"cuMemFreeAsync", entry::cuMemFreeAsync as *mut c_void),
        (c"cuMemFreeAsync_ptsz", entry::cuMemFreeAsync_ptsz as *mut c_void),
        (c"cuMemAllocManaged", entry::cuMemAllocManaged as *mut c_void),
        (c"cuIpcGetMemHandle", ipc::cuIpcGetMemHandle as *mut c_void),
        (c"cuIpcOpenMemHandle", ipc::cuIpcOpenMemHandle as *mut c_void),
        (c"cuIpcOpenMemHandle_v2", ipc::cuIpcOpenMemHandle_v2 as *mut c_void),
        (c"cuIpcCloseMemHandle", ipc::cuIpcCloseMemHandle as *mut c_void),
        (c"cuMemGetAddressRange_v2", pointers::cuMemGetAddressRange_v2 as *mut c_void),
        (c"cuPointerGetAttribute", pointers::cuPointerGetAttribute as *mut c_void),
        (c"cuMemRetainAllocationHandle", pointers::cuMemRetainAllocationHandle as *mut c_void),
    ];
    let tables: [fn() -> Vec<Route>; 12] = [
        pools::pool_routes,
        pools::attribute_routes,
        vmm::vmm_routes,
        gated::copy_routes,
        gated::stream_memory_routes,
        gated::memset_routes,
        gated::sync_routes,
        gated::capture_routes,
        gated::graph_routes,
        launch::launch_routes,
        reset::reset_routes,
        contexts::context_routes,
    ];
    memory.into_iter().chain(tables.iter().flat_map(|table| table())).collect()
}

/// A routed function: the driver's real pointer, its versioned name, tiermem's wrapper.
type Entry = (usize, &'static CStr, usize);

/// Every routed function the loaded driver has; built once, when the driver is first needed.
fn table() -> &'static [Entry] {
    static TABLE: OnceLock<Vec<Entry>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let Some(driver) = driver() else { return Vec::new() };
        routed()
            .iter()
            .filter_map(|&(name, wrapper)| {
                let real = driver.symbol(name);
                (!real.is_null()).then_some((real as usize, name, wrapper as usize))
            })
            .collect()
    })
}

/// Tiermem's wrapper if `real` is a routed function of the driver, else `real` itself.
///
/// A library may give two names one address (an alias, or two functions of one body folded
/// into one by its linker: the fake driver's legacy and per-thread variants in a release
/// build), and the address alone then cannot say which wrapper was asked for. So the entry
/// is the one with that address that `fits` best, the first on a tie: `fits` scores a
/// routed name against what the caller asked for (`dlsym`: the name; `cuGetProcAddress`: the
/// name and the stream flavour, [`proc_fit`]).
fn route(real: *mut c_void, fits: impl Fn(&CStr) -> u8) -> *mut c_void {
    pick(table(), real as usize, fits).map_or(real, |wrapper| wrapper as *mut c_void)
}

/// The wrapper of the entry of `entries` at `real` that `fits` scores highest (the first of
/// equals), if any is at `real`.
fn pick(entries: &[Entry], real: usize, fits: impl Fn(&CStr) -> u8) -> Option<usize> {
    let at = entries.iter().filter(|&&(r, _, _)| r == real);
    // max_by_key keeps the last of equals: the first wins, reversed.
    at.rev().max_by_key(|&&(_, name, _)| fits(name)).map(|&(_, _, wrapper)| wrapper)
}

/// How well a routed `name` fits `cuGetProcAddress(symbol, …, flags)`: 2 for the symbol in
/// the asked-for stream flavour (`_ptsz`/`_ptds` for per-thread), 1 for the symbol in the
/// other (a function without a per-thread variant), 0 for another function.
fn proc_fit(name: &CStr, symbol: &[u8], per_thread: bool) -> u8 {
    let name = name.to_bytes();
    let Some(rest) = name.strip_prefix(symbol) else { return 0 };
    if !(rest.is_empty() || rest.starts_with(b"_")) {
        return 0;
    }
    let threaded = rest.ends_with(b"_ptsz") || rest.ends_with(b"_ptds");
    1 + u8::from(threaded == per_thread)
}

/// Whether `name` looks like a driver API function (`cu` and a capital: `cuMemAlloc_v2`, not
/// `cudaMalloc` or `cublasCreate`), the only names worth a look in the table.
fn driver_name(name: &[u8]) -> bool {
    name.len() > 2 && name.starts_with(b"cu") && name[2].is_ascii_uppercase()
}

/// glibc's `dlsym` once known (set when the library loads, [`remember_next_dlsym`]): where
/// [`dlsym`] sends a lookup with `RTLD_NEXT`, keeping its caller's return address.
static NEXT_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// Finds glibc's `dlsym` for [`dlsym`]'s `RTLD_NEXT` lookups (run as the library loads, and
/// again by each routed lookup, in case a lookup comes before).
pub(crate) fn remember_next_dlsym() {
    if let Some(real) = driver::real_dlsym() {
        NEXT_DLSYM.store(real as *mut c_void, Ordering::Release);
    }
}

/// `dlsym`: glibc's answer, with a routed driver function swapped for tiermem's wrapper (and
/// NVML's memory queries for tiermem's, nvml.rs) — [`routed_dlsym`] — except for `RTLD_NEXT`.
///
/// glibc resolves `RTLD_NEXT` relative to the object that called `dlsym`, which it finds from
/// the return address. Called through a Rust function, that object would be this library, and
/// a program's (or a library's) own `dlsym(RTLD_NEXT, …)` would find the next definition after
/// libtiermem_preload instead of after itself — an interposer looking up the function it wraps
/// (UCX's memory hooks, another preload library) could then get its own. So on x86-64 `dlsym`
/// is a trampoline: `RTLD_NEXT` jumps straight to glibc's `dlsym` with the caller's return
/// address in place, anything else to [`routed_dlsym`]. A lookup with `RTLD_NEXT` is answered
/// as glibc answers it, unrouted: from the program, the next definition of a routed driver
/// function is tiermem's own export anyway (the preload library comes right after the program).
///
/// # Safety
/// As glibc's `dlsym`.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    // SAFETY: the trampoline touches only rax (caller-saved) and the flags, and jumps with the
    // stack, the arguments (rdi, rsi) and the return address as the caller left them, so glibc's
    // `dlsym` or `routed_dlsym` (both `extern "C"` with this signature) returns straight to it.
    // RTLD_NEXT is `(void *) -1`; `NEXT_DLSYM` is null or glibc's `dlsym`.
    std::arch::naked_asm!(
        "cmp rdi, -1",
        "jne {routed}",
        "mov rax, qword ptr [rip + {next}]",
        "test rax, rax",
        "jz {routed}",
        "jmp rax",
        routed = sym routed_dlsym,
        next = sym NEXT_DLSYM,
    )
}

/// `dlsym` (see the x86-64 version): elsewhere every lookup is [`routed_dlsym`]'s, and
/// `RTLD_NEXT` is resolved relative to this library (docs/transparent.md).
///
/// # Safety
/// As glibc's `dlsym`.
#[cfg(not(target_arch = "x86_64"))]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    // SAFETY: the caller's arguments, as glibc's dlsym takes them.
    unsafe { routed_dlsym(handle, name) }
}

/// glibc's answer, with a routed driver function swapped for tiermem's wrapper (and NVML's
/// memory queries for tiermem's, nvml.rs). Lookups on a thread inside tiermem (cudarc loading
/// the driver for the mechanism crate) get glibc's answer unchanged.
///
/// # Safety
/// As glibc's `dlsym`.
unsafe extern "C" fn routed_dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let Some(real_dlsym) = driver::real_dlsym() else { return std::ptr::null_mut() };
    if NEXT_DLSYM.load(Ordering::Relaxed).is_null() {
        remember_next_dlsym();
    }
    // SAFETY: the caller's arguments, passed to glibc's dlsym as they came.
    let found = unsafe { real_dlsym(handle, name) };
    if found.is_null() || name.is_null() || inside() {
        return found;
    }
    // SAFETY: checked non-null; dlsym's caller passes a NUL-terminated name.
    let name = unsafe { CStr::from_ptr(name) }.to_bytes();
    if name.starts_with(b"nvml") {
        return crate::nvml::route(name, found).unwrap_or(found);
    }
    if !driver_name(name) {
        return found;
    }
    let _inside = enter();
    catch_unwind(AssertUnwindSafe(|| route(found, |routed| u8::from(routed.to_bytes() == name)))).unwrap_or(found)
}

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`: `cuGetProcAddress`'s flag for the
/// per-thread default stream's variants.
const PER_THREAD_FLAG: u64 = 2;

/// Routes the pointer a successful `cuGetProcAddress(_v2)` of `symbol` with `flags` wrote to
/// `pfn`.
///
/// # Safety
/// `pfn` null or valid for reads and writes; `symbol` null or NUL-terminated.
unsafe fn route_result(code: CuResult, symbol: *const c_char, flags: u64, pfn: *mut *mut c_void) -> CuResult {
    if code == CUDA_SUCCESS && !pfn.is_null() {
        // SAFETY: checked non-null; the caller passed the driver a NUL-terminated name.
        let symbol = if symbol.is_null() { &[][..] } else { unsafe { CStr::from_ptr(symbol) }.to_bytes() };
        let per_thread = flags & PER_THREAD_FLAG != 0;
        // SAFETY: checked non-null; the driver wrote the function it found there.
        unsafe { *pfn = route(*pfn, |name| proc_fit(name, symbol, per_thread)) };
    }
    code
}

/// `cuGetProcAddress` (CUDA 11.3 to 12): the driver resolves `symbol` for `cuda_version` and
/// `flags` (legacy or per-thread default stream); a routed result becomes tiermem's wrapper.
///
/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CuResult {
    let Some(real) = driver().and_then(|d| d.get_proc_address) else { return CUDA_ERROR_NOT_FOUND };
    // SAFETY: the driver's own function with the caller's arguments.
    let code = to_driver(|| unsafe { real(symbol, pfn, cuda_version, flags) });
    if inside() {
        return code;
    }
    // SAFETY: the caller's out-pointer, which the driver just wrote on success.
    guard("cuGetProcAddress", || unsafe { route_result(code, symbol, flags, pfn) })
}

/// `cuGetProcAddress_v2` (CUDA 12 and later; `cuGetProcAddress` in 12.x headers): as
/// `cuGetProcAddress`, with the driver's `symbol_status` passed back unchanged.
///
/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    symbol_status: *mut c_int,
) -> CuResult {
    let Some(real) = driver().and_then(|d| d.get_proc_address_v2) else { return CUDA_ERROR_NOT_FOUND };
    // SAFETY: the driver's own function with the caller's arguments.
    let code = to_driver(|| unsafe { real(symbol, pfn, cuda_version, flags, symbol_status) });
    if inside() {
        return code;
    }
    // SAFETY: the caller's out-pointer, which the driver just wrote on success.
    guard("cuGetProcAddress_v2", || unsafe { route_result(code, symbol, flags, pfn) })
}

#[cfg(test)]
mod tests {
    use super::{driver_name, pick, proc_fit, Entry};
    use std::ffi::CStr;

    #[test]
    fn names_at_one_address_are_told_apart_by_what_was_asked() {
        // Two functions at one address (10), one alone (20).
        let entries: [Entry; 3] =
            [(10, c"cuMemAllocAsync", 1), (10, c"cuMemAllocAsync_ptsz", 2), (20, c"cuMemFree_v2", 3)];
        let proc = |symbol: &'static [u8], per_thread| move |name: &CStr| proc_fit(name, symbol, per_thread);
        assert_eq!(pick(&entries, 10, proc(b"cuMemAllocAsync", false)), Some(1));
        assert_eq!(pick(&entries, 10, proc(b"cuMemAllocAsync", true)), Some(2));
        let named = |asked: &'static [u8]| move |name: &CStr| u8::from(name.to_bytes() == asked);
        assert_eq!(pick(&entries, 10, named(b"cuMemAllocAsync_ptsz")), Some(2));
        assert_eq!(pick(&entries, 10, named(b"cuMemAllocAsync")), Some(1));
        // Nothing fits better than the rest: the first; another address: its own; none: none.
        assert_eq!(pick(&entries, 10, |_| 0), Some(1));
        assert_eq!(pick(&entries, 20, proc(b"cuMemFree", true)), Some(3));
        assert_eq!(pick(&entries, 30, |_| 1), None);
    }

    #[test]
    fn a_name_fits_its_symbol_and_flavour() {
        assert_eq!(proc_fit(c"cuMemAlloc_v2", b"cuMemAlloc", false), 2);
        assert_eq!(proc_fit(c"cuMemAlloc_v2", b"cuMemAlloc", true), 1);
        assert_eq!(proc_fit(c"cuLaunchKernel_ptsz", b"cuLaunchKernel", true), 2);
        assert_eq!(proc_fit(c"cuMemcpyHtoDAsync_v2_ptds", b"cuMemcpyHtoDAsync", true), 2);
        assert_eq!(proc_fit(c"cuMemAllocAsync", b"cuMemAlloc", false), 0);
        assert_eq!(proc_fit(c"cuMemFree_v2", b"cuMemAlloc", false), 0);
    }

    #[test]
    fn only_driver_api_names_are_looked_at() {
        for name in ["cuMemAlloc_v2", "cuGetProcAddress", "cuInit"] {
            assert!(driver_name(name.as_bytes()), "{name}");
        }
        for name in ["cudaMalloc", "cublasCreate_v2", "cu", "malloc", "CUDA"] {
            assert!(!driver_name(name.as_bytes()), "{name}");
        }
    }
}
