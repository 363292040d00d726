//! Thin helpers around the raw driver entry points: error mapping, the symbol probe, and
//! small formatting functions. Nothing here holds state.

use std::ffi::{c_char, CStr};

use cudarc::driver::sys::{self, CUresult};

use crate::{DeviceError, Result};

/// Shown whenever the driver library is missing or unusable.
pub(super) const NO_DRIVER_HINT: &str = "libcuda.so could not be loaded; is the NVIDIA driver \
     installed? set TIERMEM_BACKEND=sim to use the simulated device";

/// `cuEventElapsedTime` and `cuEventElapsedTime_v2` share this signature.
pub(super) type ElapsedFn = unsafe extern "C" fn(*mut f32, sys::CUevent, sys::CUevent) -> CUresult;

/// Every driver symbol this backend calls through `cudarc::driver::sys`, spelled exactly as
/// cudarc resolves it. cudarc panics on the first call of a missing one, so `open` checks
/// them all first and refuses the device instead.
const REQUIRED_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDeviceGetName",
    "cuDeviceTotalMem_v2",
    "cuDeviceCanAccessPeer",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxGetStreamPriorityRange",
    "cuMemGetInfo_v2",
    "cuMemGetAllocationGranularity",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuStreamCreateWithPriority",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemsetD8Async",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuLaunchKernel",
];

/// Names of required symbols the loaded driver library lacks. Only call when
/// `sys::is_culib_present()` is true.
pub(super) fn missing_symbols() -> Vec<&'static str> {
    // SAFETY: the caller checked that the library can be loaded, so `culib` returns it
    // instead of panicking; it stays loaded for the life of the process.
    let lib = unsafe { sys::culib() };
    REQUIRED_SYMBOLS
        .iter()
        .copied()
        // SAFETY: the symbol is only looked up, never called, so its type does not matter.
        .filter(|name| unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_err())
        .collect()
}

/// Whether the loaded driver library exports `name` (for entry points only some features need:
/// a driver without them still opens). Only call when `sys::is_culib_present()` is true.
pub(super) fn has_symbol(name: &str) -> bool {
    // SAFETY: as in `missing_symbols`: the symbol is only looked up, never called.
    let lib = unsafe { sys::culib() };
    // SAFETY: as above.
    unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_ok()
}

/// The event-timing entry point: CUDA 12.8+ drivers export `cuEventElapsedTime_v2` (the only
/// name in cudarc's CUDA 13 bindings, and what `cuEventElapsedTime` means in 13.0 headers);
/// older drivers only the original. Same signature and semantics for completed events.
pub(super) fn resolve_elapsed() -> Option<(&'static str, ElapsedFn)> {
    // SAFETY: as in `missing_symbols`; the library is never unloaded, so the copied function
    // pointer stays valid.
    let lib = unsafe { sys::culib() };
    ["cuEventElapsedTime_v2", "cuEventElapsedTime"].into_iter().find_map(|name| {
        // SAFETY: both symbols have exactly the `ElapsedFn` C signature in cuda.h.
        unsafe { lib.get::<ElapsedFn>(name.as_bytes()) }.ok().map(|f| (name, *f))
    })
}

/// The one place a `CUresult` becomes a `DeviceError`.
pub(super) fn check(call: &'static str, r: CUresult, detail: impl FnOnce() -> String) -> Result<()> {
    match r {
        CUresult::CUDA_SUCCESS => Ok(()),
        CUresult::CUDA_ERROR_OUT_OF_MEMORY => Err(DeviceError::OutOfMemory { call, detail: detail() }),
        CUresult::CUDA_ERROR_DEINITIALIZED => Err(DeviceError::DriverShutDown { call }),
        other => Err(DeviceError::Driver { call, code: error_name(other), detail: detail() }),
    }
}

/// `CUDA_ERROR_...` as the driver names the code, or the number if it cannot.
pub(super) fn error_name(r: CUresult) -> String {
    let mut name: *const c_char = std::ptr::null();
    // SAFETY: `name` is a valid out-pointer; on success the driver stores a pointer to a
    // static NUL-terminated string.
    let rc = unsafe { sys::cuGetErrorName(r, &mut name) };
    if rc == CUresult::CUDA_SUCCESS && !name.is_null() {
        // SAFETY: checked non-null; the driver's error-name strings are static and NUL-terminated.
        unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
    } else {
        format!("CUresult {}", r as u32)
    }
}

/// `cuDriverGetVersion`'s integer (1000 * major + 10 * minor) as "13.0".
pub(super) fn format_cuda_version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// The text of a caught panic.
pub(super) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// The driver version as `nvidia-smi` prints it, or the CUDA version with a note.
pub(super) fn nvml_driver_version(cuda_version: &str) -> String {
    nvml_wrapper::Nvml::init()
        .and_then(|nvml| nvml.sys_driver_version())
        .unwrap_or_else(|_| format!("{cuda_version} (CUDA; NVML unavailable)"))
}
