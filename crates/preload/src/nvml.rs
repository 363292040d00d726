//! NVML's memory queries, consistent with `cuMemGetInfo`: a program that asks NVML how much
//! memory its GPU has (pynvml, `torch.cuda.device_memory_used`, a framework sizing its caches)
//! hears the budget, as `cuMemGetInfo` says it — total = the budget, used = tiermem's HBM in
//! this process, free = the difference — for a GPU tiermem manages in this process; any other
//! GPU, or a query before tiermem has seen the GPU, gets NVML's own answer.
//!
//! NVML has no versioned lookup like `cuGetProcAddress`: the program takes
//! `nvmlDeviceGetMemoryInfo(_v2)` by name (ctypes and pynvml through `dlsym`, C programs through
//! the dynamic linker), so both doors hand out tiermem's wrapper and it calls the real function
//! found beside the one the program would have had. NVML numbers GPUs its own way (PCI order;
//! `CUDA_VISIBLE_DEVICES` renumbers only CUDA's), so a device is matched to a CUDA ordinal by its
//! PCI address: `nvmlDeviceGetPciInfo_v3` against `cuDeviceGetPCIBusId`.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::boundary::{enter, inside};
use crate::driver::{driver, lookup};
use crate::process;

/// `nvmlReturn_t`: success, and what a wrapper answers when NVML itself is not there.
const NVML_SUCCESS: c_int = 0;
const NVML_ERROR_UNINITIALIZED: c_int = 1;

/// `nvmlMemory_t`.
#[repr(C)]
pub struct Memory {
    total: u64,
    free: u64,
    used: u64,
}

/// `nvmlMemory_v2_t` (NVML 12): `reserved` is the driver's and firmware's share.
#[repr(C)]
pub struct MemoryV2 {
    version: c_uint,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

/// The leading part of `nvmlPciInfo_t` up to the fields read here (the v3 layout).
#[repr(C)]
struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

type Device = *mut c_void;
type GetPciInfo = unsafe extern "C" fn(Device, *mut PciInfo) -> c_int;
type CudaPciBusId = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> u32;

/// The real functions, as the program's own lookups found them (or, for a program linked
/// against NVML, the next definition after this library).
static REAL_V1: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static REAL_V2: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// The routed NVML names and tiermem's wrappers; `dlsym` (routes.rs) asks here.
pub fn route(name: &[u8], found: *mut c_void) -> Option<*mut c_void> {
    let (real, wrapper) = match name {
        b"nvmlDeviceGetMemoryInfo" => (&REAL_V1, nvmlDeviceGetMemoryInfo as *mut c_void),
        b"nvmlDeviceGetMemoryInfo_v2" => (&REAL_V2, nvmlDeviceGetMemoryInfo_v2 as *mut c_void),
        _ => return None,
    };
    if found != wrapper {
        real.store(found, Ordering::Release);
    }
    Some(wrapper)
}

/// The real function behind `slot`, or the next definition of `name` after this library.
fn real(slot: &AtomicPtr<c_void>, name: &CStr) -> *mut c_void {
    let known = slot.load(Ordering::Acquire);
    if !known.is_null() {
        return known;
    }
    let next = lookup(libc::RTLD_NEXT, name);
    slot.store(next, Ordering::Release);
    next
}

/// `domain:bus:device` of a PCI address written as NVML and CUDA write them ("00000000:3B:00.0",
/// "0000:3b:00.0").
fn pci_address(text: &str) -> Option<(u32, u32, u32)> {
    let mut parts = text.trim_end_matches('\0').split([':', '.']);
    let mut next = || u32::from_str_radix(parts.next()?.trim(), 16).ok();
    Some((next()?, next()?, next()?))
}

/// The CUDA ordinal of NVML's `device`, among the GPUs tiermem manages here, by PCI address.
fn cuda_ordinal(device: Device, some_nvml_function: *mut c_void) -> Option<usize> {
    // NVML's own nvmlDeviceGetPciInfo_v3, from the library the real function lives in.
    // SAFETY: an all-zero Dl_info is valid; dladdr only reads the address.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid out-pointer.
    if unsafe { libc::dladdr(some_nvml_function, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: the path dladdr gave; RTLD_NOLOAD only returns a handle of a loaded library.
    let handle = unsafe { libc::dlopen(info.dli_fname, libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if handle.is_null() {
        return None;
    }
    let get_pci = lookup(handle, c"nvmlDeviceGetPciInfo_v3");
    // SAFETY: balances the dlopen above; the library stays loaded (the program holds it).
    unsafe { libc::dlclose(handle) };
    if get_pci.is_null() {
        return None;
    }
    // SAFETY: NVML's nvmlDeviceGetPciInfo_v3 has the `GetPciInfo` signature.
    let get_pci = unsafe { std::mem::transmute::<*mut c_void, GetPciInfo>(get_pci) };
    // SAFETY: all-zero is a valid PciInfo (integers and characters).
    let mut pci: PciInfo = unsafe { std::mem::zeroed() };
    // SAFETY: the program's device handle and a valid out-pointer.
    if unsafe { get_pci(device, &mut pci) } != NVML_SUCCESS {
        return None;
    }
    let wanted = (pci.domain, pci.bus, pci.device);
    let cuda_bus_id = driver()?.symbol(c"cuDeviceGetPCIBusId");
    if cuda_bus_id.is_null() {
        return None;
    }
    // SAFETY: the driver's cuDeviceGetPCIBusId has the `CudaPciBusId` signature.
    let cuda_bus_id = unsafe { std::mem::transmute::<*mut c_void, CudaPciBusId>(cuda_bus_id) };
    process::managed_gpus().into_iter().find(|&ordinal| {
        let mut text = [0 as c_char; 32];
        // SAFETY: a buffer of 32 characters, its length, a device handle (= its ordinal).
        let ok = unsafe { cuda_bus_id(text.as_mut_ptr(), text.len() as c_int, ordinal as c_int) } == 0;
        // SAFETY: the driver wrote a NUL-terminated string into the buffer.
        ok && pci_address(&unsafe { CStr::from_ptr(text.as_ptr()) }.to_string_lossy()) == Some(wanted)
    })
}

/// The budget's view of NVML's `device`: `(total, used)`, if tiermem manages it here.
fn budget_view(device: Device, real: *mut c_void) -> Option<(u64, u64)> {
    let ordinal = cuda_ordinal(device, real)?;
    let (budget, used) = process::budget_and_use(ordinal)?;
    Some((budget as u64, used as u64))
}

/// Calls NVML's query behind `slot` (`name`), then, for a GPU tiermem manages, writes the
/// budget's view into `*memory` with `fill(memory, total, used)`.
///
/// # Safety
/// `memory` as the query takes it; the query's signature is `(device, *mut M) -> nvmlReturn_t`.
unsafe fn budgeted<M>(
    slot: &AtomicPtr<c_void>,
    name: &CStr,
    device: Device,
    memory: *mut M,
    fill: fn(&mut M, u64, u64),
) -> c_int {
    let real = real(slot, name);
    if real.is_null() {
        return NVML_ERROR_UNINITIALIZED;
    }
    // SAFETY: NVML's memory queries take a device and a pointer to their struct (nvml.h).
    let query =
        unsafe { std::mem::transmute_copy::<*mut c_void, unsafe extern "C" fn(Device, *mut M) -> c_int>(&real) };
    // SAFETY: the caller's arguments.
    let code = unsafe { query(device, memory) };
    if code != NVML_SUCCESS || memory.is_null() || inside() {
        return code;
    }
    let _inside = enter();
    if let Ok(Some((total, used))) = std::panic::catch_unwind(|| budget_view(device, real)) {
        // SAFETY: checked non-null; NVML just filled it.
        fill(unsafe { &mut *memory }, total, used);
    }
    code
}

/// `nvmlDeviceGetMemoryInfo`: NVML's answer, the budget's for a GPU tiermem manages.
///
/// # Safety
/// As NVML's.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: Device, memory: *mut Memory) -> c_int {
    let fill =
        |m: &mut Memory, total: u64, used: u64| (m.total, m.used, m.free) = (total, used, total.saturating_sub(used));
    // SAFETY: the caller's arguments, as NVML takes them.
    unsafe { budgeted(&REAL_V1, c"nvmlDeviceGetMemoryInfo", device, memory, fill) }
}

/// `nvmlDeviceGetMemoryInfo_v2`: as [`nvmlDeviceGetMemoryInfo`]; `reserved` is kept.
///
/// # Safety
/// As NVML's.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(device: Device, memory: *mut MemoryV2) -> c_int {
    let fill =
        |m: &mut MemoryV2, total: u64, used: u64| (m.total, m.used, m.free) = (total, used, total.saturating_sub(used));
    // SAFETY: the caller's arguments, as NVML takes them.
    unsafe { budgeted(&REAL_V2, c"nvmlDeviceGetMemoryInfo_v2", device, memory, fill) }
}

#[cfg(test)]
mod tests {
    use super::pci_address;

    #[test]
    fn nvml_and_cuda_write_one_address_two_ways() {
        assert_eq!(pci_address("00000000:3B:00.0"), Some((0, 0x3b, 0)));
        assert_eq!(pci_address("0000:3b:00.0\0"), Some((0, 0x3b, 0)));
        assert_eq!(pci_address("0001:c1:1f.0"), Some((1, 0xc1, 0x1f)));
        assert_eq!(pci_address("garbage"), None);
    }
}
