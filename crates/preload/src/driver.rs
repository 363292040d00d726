//! The real things beneath the interposition: glibc's `dlsym`, the loaded `libcuda`, and the
//! driver's own entry points that tiermem calls or passes calls through to.
//!
//! Nothing here calls cudarc: these are looked up with the real `dlsym` on libcuda's handle,
//! so they are the driver's functions whatever our overrides would answer.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

use crate::boundary::CuResult;

pub type DeviceHandle = c_int;
pub type Stream = *mut c_void;

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
pub type GetProcAddressFn = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CuResult;
pub type GetProcAddressV2Fn = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CuResult;
pub type MemAllocFn = unsafe extern "C" fn(*mut u64, usize) -> CuResult;
pub type MemAllocPitchFn = unsafe extern "C" fn(*mut u64, *mut usize, usize, usize, c_uint) -> CuResult;
pub type MemFreeFn = unsafe extern "C" fn(u64) -> CuResult;
pub type MemGetInfoFn = unsafe extern "C" fn(*mut usize, *mut usize) -> CuResult;
pub type MemAllocAsyncFn = unsafe extern "C" fn(*mut u64, usize, Stream) -> CuResult;
pub type MemFreeAsyncFn = unsafe extern "C" fn(u64, Stream) -> CuResult;
pub type MemAllocManagedFn = unsafe extern "C" fn(*mut u64, usize, c_uint) -> CuResult;
pub type CtxGetDeviceFn = unsafe extern "C" fn(*mut DeviceHandle) -> CuResult;
pub type CtxSynchronizeFn = unsafe extern "C" fn() -> CuResult;
pub type StreamSynchronizeFn = unsafe extern "C" fn(Stream) -> CuResult;
pub type Context = *mut c_void;
pub type PrimaryCtxRetainFn = unsafe extern "C" fn(*mut Context, DeviceHandle) -> CuResult;
pub type PrimaryCtxReleaseFn = unsafe extern "C" fn(DeviceHandle) -> CuResult;
pub type CtxSetCurrentFn = unsafe extern "C" fn(Context) -> CuResult;
pub type CtxGetCurrentFn = unsafe extern "C" fn(*mut Context) -> CuResult;
/// `cuFuncGetParamInfo` and `cuKernelGetParamInfo` (CUDA 12.4): a kernel, a parameter's index,
/// its offset and size.
pub type ParamInfoFn = unsafe extern "C" fn(*mut c_void, usize, *mut usize, *mut usize) -> CuResult;
pub type IpcGetMemHandleFn = unsafe extern "C" fn(*mut crate::ipc_wire::IpcMemHandle, u64) -> CuResult;
pub type IpcOpenMemHandleFn = unsafe extern "C" fn(*mut u64, crate::ipc_wire::IpcMemHandle, c_uint) -> CuResult;
pub type IpcCloseMemHandleFn = unsafe extern "C" fn(u64) -> CuResult;
pub type MemGetAddressRangeFn = unsafe extern "C" fn(*mut u64, *mut usize, u64) -> CuResult;
pub type PointerGetAttributeFn = unsafe extern "C" fn(*mut c_void, c_int, u64) -> CuResult;
/// `cuFuncGetName` and `cuKernelGetName` (CUDA 12.3): a kernel's name, kept by the driver.
pub type NameFn = unsafe extern "C" fn(*mut *const std::ffi::c_char, *mut c_void) -> CuResult;

/// glibc's `dlsym`, found by version so that our own `dlsym` is skipped (2.34 moved it into
/// libc proper; 2.2.5 and 2.17 are the base versions on x86_64 and aarch64).
pub fn real_dlsym() -> Option<DlsymFn> {
    static REAL: OnceLock<Option<DlsymFn>> = OnceLock::new();
    *REAL.get_or_init(|| {
        [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"].iter().find_map(|version| {
            // SAFETY: dlvsym takes a pseudo-handle and two NUL-terminated strings; it does not
            // call dlsym, so this cannot recurse into our override.
            let f = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
            // SAFETY: glibc's dlsym has exactly the `DlsymFn` signature.
            (!f.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(f) })
        })
    })
}

/// Looks `name` up with the real `dlsym`; null if absent (or if glibc's `dlsym` was not found).
pub fn lookup(handle: *mut c_void, name: &CStr) -> *mut c_void {
    match real_dlsym() {
        // SAFETY: `handle` is a handle from dlopen or a pseudo-handle; `name` is NUL-terminated.
        Some(dlsym) => unsafe { dlsym(handle, name.as_ptr()) },
        None => std::ptr::null_mut(),
    }
}

/// The loaded CUDA driver and the entry points of it that tiermem uses.
pub struct Driver {
    handle: *mut c_void,
    pub get_proc_address: Option<GetProcAddressFn>,
    pub get_proc_address_v2: Option<GetProcAddressV2Fn>,
    pub mem_alloc: Option<MemAllocFn>,
    pub mem_alloc_pitch: Option<MemAllocPitchFn>,
    pub mem_free: Option<MemFreeFn>,
    pub mem_get_info: Option<MemGetInfoFn>,
    pub mem_alloc_async: Option<MemAllocAsyncFn>,
    pub mem_alloc_async_ptsz: Option<MemAllocAsyncFn>,
    pub mem_free_async: Option<MemFreeAsyncFn>,
    pub mem_free_async_ptsz: Option<MemFreeAsyncFn>,
    pub mem_alloc_managed: Option<MemAllocManagedFn>,
    pub ctx_get_device: Option<CtxGetDeviceFn>,
    pub ctx_synchronize: Option<CtxSynchronizeFn>,
    pub stream_synchronize: Option<StreamSynchronizeFn>,
    pub primary_ctx_retain: Option<PrimaryCtxRetainFn>,
    pub primary_ctx_release: Option<PrimaryCtxReleaseFn>,
    pub ctx_set_current: Option<CtxSetCurrentFn>,
    pub ctx_get_current: Option<CtxGetCurrentFn>,
    pub func_get_param_info: Option<ParamInfoFn>,
    pub kernel_get_param_info: Option<ParamInfoFn>,
    pub func_get_name: Option<NameFn>,
    pub kernel_get_name: Option<NameFn>,
    pub ipc_get_mem_handle: Option<IpcGetMemHandleFn>,
    pub ipc_open_mem_handle: Option<IpcOpenMemHandleFn>,
    pub ipc_open_mem_handle_v2: Option<IpcOpenMemHandleFn>,
    pub ipc_close_mem_handle: Option<IpcCloseMemHandleFn>,
    pub mem_get_address_range: Option<MemGetAddressRangeFn>,
    pub pointer_get_attribute: Option<PointerGetAttributeFn>,
}

// SAFETY: the handle and function pointers are immutable after loading, and the driver library
// is never unloaded (dlopen's reference is never dropped); the driver API is thread-safe.
unsafe impl Send for Driver {}
// SAFETY: as for Send: nothing in a Driver changes after it is made.
unsafe impl Sync for Driver {}

/// The driver, loaded at the first call that needs it; `None` where no libcuda loads (then no
/// CUDA program can run either, and each wrapper answers `CUDA_ERROR_NOT_INITIALIZED`).
pub fn driver() -> Option<&'static Driver> {
    static DRIVER: OnceLock<Option<Driver>> = OnceLock::new();
    DRIVER.get_or_init(Driver::load).as_ref()
}

macro_rules! entry {
    ($handle:expr, $name:literal, $ty:ty) => {{
        let f = lookup($handle, $name);
        // SAFETY: the driver exports `$name` with the C signature `$ty` (cuda.h).
        (!f.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, $ty>(f) })
    }};
}

impl Driver {
    /// The driver a CUDA program loads: `libcuda.so.1` (its soname), else `libcuda.so`. If the
    /// program loaded it already, dlopen returns that copy (matched by soname).
    fn load() -> Option<Driver> {
        let handle = [c"libcuda.so.1", c"libcuda.so"].iter().find_map(|name| {
            // SAFETY: dlopen of a library name; the reference taken is never released, so
            // the library and every pointer looked up in it stay valid.
            let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY) };
            (!h.is_null()).then_some(h)
        })?;
        Some(Driver {
            handle,
            get_proc_address: entry!(handle, c"cuGetProcAddress", GetProcAddressFn),
            get_proc_address_v2: entry!(handle, c"cuGetProcAddress_v2", GetProcAddressV2Fn),
            mem_alloc: entry!(handle, c"cuMemAlloc_v2", MemAllocFn),
            mem_alloc_pitch: entry!(handle, c"cuMemAllocPitch_v2", MemAllocPitchFn),
            mem_free: entry!(handle, c"cuMemFree_v2", MemFreeFn),
            mem_get_info: entry!(handle, c"cuMemGetInfo_v2", MemGetInfoFn),
            mem_alloc_async: entry!(handle, c"cuMemAllocAsync", MemAllocAsyncFn),
            mem_alloc_async_ptsz: entry!(handle, c"cuMemAllocAsync_ptsz", MemAllocAsyncFn),
            mem_free_async: entry!(handle, c"cuMemFreeAsync", MemFreeAsyncFn),
            mem_free_async_ptsz: entry!(handle, c"cuMemFreeAsync_ptsz", MemFreeAsyncFn),
            mem_alloc_managed: entry!(handle, c"cuMemAllocManaged", MemAllocManagedFn),
            ctx_get_device: entry!(handle, c"cuCtxGetDevice", CtxGetDeviceFn),
            ctx_synchronize: entry!(handle, c"cuCtxSynchronize", CtxSynchronizeFn),
            stream_synchronize: entry!(handle, c"cuStreamSynchronize", StreamSynchronizeFn),
            primary_ctx_retain: entry!(handle, c"cuDevicePrimaryCtxRetain", PrimaryCtxRetainFn),
            primary_ctx_release: entry!(handle, c"cuDevicePrimaryCtxRelease_v2", PrimaryCtxReleaseFn),
            ctx_set_current: entry!(handle, c"cuCtxSetCurrent", CtxSetCurrentFn),
            ctx_get_current: entry!(handle, c"cuCtxGetCurrent", CtxGetCurrentFn),
            func_get_param_info: entry!(handle, c"cuFuncGetParamInfo", ParamInfoFn),
            kernel_get_param_info: entry!(handle, c"cuKernelGetParamInfo", ParamInfoFn),
            func_get_name: entry!(handle, c"cuFuncGetName", NameFn),
            kernel_get_name: entry!(handle, c"cuKernelGetName", NameFn),
            ipc_get_mem_handle: entry!(handle, c"cuIpcGetMemHandle", IpcGetMemHandleFn),
            ipc_open_mem_handle: entry!(handle, c"cuIpcOpenMemHandle", IpcOpenMemHandleFn),
            ipc_open_mem_handle_v2: entry!(handle, c"cuIpcOpenMemHandle_v2", IpcOpenMemHandleFn),
            ipc_close_mem_handle: entry!(handle, c"cuIpcCloseMemHandle", IpcCloseMemHandleFn),
            mem_get_address_range: entry!(handle, c"cuMemGetAddressRange_v2", MemGetAddressRangeFn),
            pointer_get_attribute: entry!(handle, c"cuPointerGetAttribute", PointerGetAttributeFn),
        })
    }

    /// The driver's own `name`, or null.
    pub fn symbol(&self, name: &CStr) -> *mut c_void {
        lookup(self.handle, name)
    }
}

/// GPU `ordinal`'s primary context (the CUDA runtime's, hence the program's), retained and
/// current on the calling thread — one of tiermem's own, which has no context — until dropped.
pub struct PrimaryContext {
    ordinal: DeviceHandle,
}

impl PrimaryContext {
    pub fn bind(ordinal: usize) -> Result<Self, String> {
        let driver = driver().ok_or("no CUDA driver")?;
        let (Some(retain), Some(set_current)) = (driver.primary_ctx_retain, driver.ctx_set_current) else {
            return Err("the driver lacks cuDevicePrimaryCtxRetain or cuCtxSetCurrent".into());
        };
        let ordinal = DeviceHandle::try_from(ordinal).map_err(|_| format!("no GPU {ordinal}"))?;
        let mut context: Context = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the driver's handles are the ordinals (process.rs).
        let retained = unsafe { retain(&mut context, ordinal) };
        if retained != 0 {
            return Err(format!("cuDevicePrimaryCtxRetain(GPU {ordinal}) failed with CUDA error {retained}"));
        }
        let bound = Self { ordinal };
        // SAFETY: `context` was just retained, so it stays alive while `bound` lives.
        match unsafe { set_current(context) } {
            0 => Ok(bound),
            code => Err(format!("cuCtxSetCurrent(GPU {ordinal}) failed with CUDA error {code}")),
        }
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        let Some(driver) = driver() else { return };
        // SAFETY: leaves this thread without a context, then drops the reference `bind` took;
        // the errors have no one to go to (the context stays retained by tiermem's device).
        unsafe {
            if let Some(set_current) = driver.ctx_set_current {
                set_current(std::ptr::null_mut());
            }
            if let Some(release) = driver.primary_ctx_release {
                release(self.ordinal);
            }
        }
    }
}
