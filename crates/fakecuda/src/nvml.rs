//! The fake's NVML (tests link `libnvidia-ml.so.1` to this library too): initialisation, the
//! GPUs' count and handles (by index or PCI address), their PCI addresses (bus 1 for GPU 0, 2
//! for GPU 1, as `cuDeviceGetPCIBusId` says) and their memory as the fake driver counts it; no
//! process ever uses a GPU, and none has utilisation samples. Enough for the preload library's
//! NVML wrappers and for the mechanism crate's NVML queries (through nvml-wrapper) to be tested.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use crate::*;

const NVML_SUCCESS: c_int = 0;
const NVML_ERROR_INVALID_ARGUMENT: c_int = 2;
const NVML_ERROR_UNINITIALIZED: c_int = 1;
const NVML_ERROR_NOT_FOUND: c_int = 6;

/// GPU 0's handle, then GPU 1's: any non-null values that are not pointers to anything.
const HANDLES: [*mut c_void; 2] = [0x6e76_6d6c as *mut c_void, 0x6e76_6d6d as *mut c_void];

/// How many GPUs the fake has: GPU 0 is known even before `cuInit` (as it always was).
fn gpus() -> usize {
    let mut gpus = 1;
    with(|fake| {
        gpus = fake.memory.gpus();
        CUDA_SUCCESS
    });
    gpus
}

/// The ordinal of the GPU whose handle is `device`, or NVML's error for a handle of none.
fn gpu_of(device: *mut c_void) -> Result<usize, c_int> {
    match HANDLES.iter().position(|&h| h == device) {
        Some(0) => Ok(0),
        Some(gpu) if gpu < gpus() => Ok(gpu),
        _ => Err(NVML_ERROR_INVALID_ARGUMENT),
    }
}

/// Writes GPU `gpu`'s handle through `device` (checked non-null by the caller).
///
/// # Safety
/// `device` valid for a write.
unsafe fn put_handle(device: *mut *mut c_void, gpu: usize) -> c_int {
    // SAFETY: the caller's out-pointer.
    unsafe { *device = HANDLES[gpu] };
    NVML_SUCCESS
}

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
    if index as usize >= gpus() || device.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: checked non-null; the caller's out-pointer.
    unsafe { put_handle(device, index as usize) }
}

/// # Safety
/// As NVML's.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> c_int {
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: checked non-null; the caller's out-pointer.
    unsafe { *count = gpus() as c_uint };
    NVML_SUCCESS
}

/// The GPU at PCI address `text`, in either of NVML's forms ("0000:01:00.0" or
/// "00000000:01:00.0", any case): bus 1 is GPU 0, bus 2 GPU 1.
fn gpu_at(text: &str) -> Option<usize> {
    let text = text.to_ascii_lowercase();
    let (domain, bus) = text.split_once(':')?;
    if !matches!(domain, "0000" | "00000000") {
        return None;
    }
    match bus {
        "01:00.0" => Some(0),
        "02:00.0" => Some(1),
        _ => None,
    }
}

/// # Safety
/// As NVML's: `bus_id` a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(bus_id: *const c_char, device: *mut *mut c_void) -> c_int {
    if bus_id.is_null() || device.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: checked non-null; the caller's NUL-terminated string.
    let text = unsafe { CStr::from_ptr(bus_id) }.to_string_lossy();
    match gpu_at(&text).filter(|&gpu| gpu < gpus()) {
        // SAFETY: checked non-null; the caller's out-pointer.
        Some(gpu) => unsafe { put_handle(device, gpu) },
        None => NVML_ERROR_NOT_FOUND,
    }
}

/// `(total, used)` of the GPU whose handle is `device`, or NVML's error.
fn memory(device: *mut c_void) -> Result<(u64, u64), c_int> {
    let gpu = gpu_of(device)?;
    let mut out = None;
    let code = with(|fake| {
        out = Some((fake.memory.total as u64, fake.memory.used(gpu) as u64));
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
    let gpu = match gpu_of(device) {
        Ok(gpu) => gpu,
        Err(code) => return code,
    };
    if pci.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let text: &[u8] = if gpu == 0 { b"00000000:01:00.0" } else { b"00000000:02:00.0" };
    let mut bus_id = [0 as c_char; 32];
    for (to, from) in bus_id.iter_mut().zip(text) {
        *to = *from as c_char;
    }
    // SAFETY: checked non-null; the caller's nvmlPciInfo_t.
    unsafe {
        *pci = PciInfo {
            bus_id_legacy: [0; 16],
            domain: 0,
            bus: 1 + gpu as c_uint,
            device: 0,
            pci_device_id: 0,
            pci_sub_system_id: 0,
            bus_id,
        }
    };
    NVML_SUCCESS
}

/// No process uses a fake GPU: a count of 0, and nothing written to `infos`.
///
/// # Safety
/// As NVML's: `count` valid for a write.
unsafe fn no_processes(device: *mut c_void, count: *mut c_uint) -> c_int {
    if let Err(code) = gpu_of(device) {
        return code;
    }
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: checked non-null; the caller's out-pointer.
    unsafe { *count = 0 };
    NVML_SUCCESS
}

/// What nvml-wrapper's `running_compute_processes` calls: none.
///
/// # Safety
/// As NVML's.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: *mut c_void,
    count: *mut c_uint,
    _infos: *mut c_void,
) -> c_int {
    // SAFETY: passed on from the caller.
    unsafe { no_processes(device, count) }
}

/// What nvml-wrapper's `running_graphics_processes` calls: none.
///
/// # Safety
/// As NVML's.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: *mut c_void,
    count: *mut c_uint,
    _infos: *mut c_void,
) -> c_int {
    // SAFETY: passed on from the caller.
    unsafe { no_processes(device, count) }
}

/// No process has a utilisation sample: `NVML_ERROR_NOT_FOUND`, what NVML answers when none ran
/// kernels since `_since` (the mechanism reads it as an idle GPU).
#[no_mangle]
pub extern "C" fn nvmlDeviceGetProcessUtilization(
    device: *mut c_void,
    _samples: *mut c_void,
    _count: *mut c_uint,
    _since: u64,
) -> c_int {
    match gpu_of(device) {
        Ok(_) => NVML_ERROR_NOT_FOUND,
        Err(code) => code,
    }
}
