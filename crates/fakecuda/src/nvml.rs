//! The fake's NVML (tests link `libnvidia-ml.so.1` to this library too): initialisation, the one
//! GPU's handle, its PCI address (bus 1, as `cuDeviceGetPCIBusId` says) and its memory as the
//! fake driver counts it. Enough for the preload library's NVML wrappers to be tested.

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::*;

const NVML_SUCCESS: c_int = 0;
const NVML_ERROR_INVALID_ARGUMENT: c_int = 2;
const NVML_ERROR_UNINITIALIZED: c_int = 1;

/// The one GPU's handle: any non-null value that is not a pointer to anything.
const HANDLE: *mut c_void = 0x6e76_6d6c as *mut c_void;

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> c_int {
    let _ = crate::device::cuInit(0);
    NVML_SUCCESS
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> c_int {
    NVML_SUCCESS
}

/// # Safety
/// As NVML's.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut *mut c_void) -> c_int {
    if index != 0 || device.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: checked non-null; the caller's out-pointer.
    unsafe { *device = HANDLE };
    NVML_SUCCESS
}

/// `(total, used)` of the fake GPU, or NVML's error.
fn memory(device: *mut c_void) -> Result<(u64, u64), c_int> {
    if device != HANDLE {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let mut out = None;
    let code = with(|fake| {
        out = Some((fake.memory.total as u64, fake.memory.used as u64));
        CUDA_SUCCESS
    });
    out.filter(|_| code == CUDA_SUCCESS).ok_or(NVML_ERROR_UNINITIALIZED)
}

/// # Safety
/// As NVML's: `memory` points at an `nvmlMemory_t` (three u64: total, free, used).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: *mut c_void, memory_out: *mut [u64; 3]) -> c_int {
    if memory_out.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    match memory(device) {
        // SAFETY: checked non-null; the caller's nvmlMemory_t.
        Ok((total, used)) => unsafe { *memory_out = [total, total - used, used] },
        Err(code) => return code,
    }
    NVML_SUCCESS
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct MemoryV2 {
    version: c_uint,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

/// # Safety
/// As NVML's.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(device: *mut c_void, memory_out: *mut MemoryV2) -> c_int {
    if memory_out.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    match memory(device) {
        Ok((total, used)) => {
            // SAFETY: checked non-null; the caller's nvmlMemory_v2_t, version set by the caller.
            let m = unsafe { &mut *memory_out };
            (m.total, m.reserved, m.free, m.used) = (total, 0, total - used, used);
        }
        Err(code) => return code,
    }
    NVML_SUCCESS
}

/// `nvmlPciInfo_t`.
#[repr(C)]
pub struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

/// # Safety
/// As NVML's.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(device: *mut c_void, pci: *mut PciInfo) -> c_int {
    if device != HANDLE || pci.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let mut bus_id = [0 as c_char; 32];
    for (to, from) in bus_id.iter_mut().zip(b"00000000:01:00.0") {
        *to = *from as c_char;
    }
    // SAFETY: checked non-null; the caller's nvmlPciInfo_t.
    unsafe {
        *pci = PciInfo {
            bus_id_legacy: [0; 16],
            domain: 0,
            bus: 1,
            device: 0,
            pci_device_id: 0,
            pci_sub_system_id: 0,
            bus_id,
        }
    };
    NVML_SUCCESS
}
