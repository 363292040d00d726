//! The fake's `cuGetProcAddress(_v2)`: a base name, a CUDA version and a stream flavour pick
//! one exported function, as the driver does. Each row says since which version a name means
//! that function; the newest row not newer than the caller's version wins. A name the fake
//! lacks, or a version older than every row of it, is `CUDA_ERROR_NOT_FOUND`.

use std::ffi::{c_char, c_int, c_void, CStr};

use crate::*;

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
const PER_THREAD: u64 = 2;
/// `CUdriverProcAddressQueryResult`.
const FOUND: c_int = 0;
const SYMBOL_NOT_FOUND: c_int = 1;
const VERSION_NOT_SUFFICIENT: c_int = 2;

struct Row {
    name: &'static CStr,
    since: c_int,
    legacy: *mut c_void,
    per_thread: Option<*mut c_void>,
}

fn row(name: &'static CStr, since: c_int, legacy: *mut c_void) -> Row {
    Row { name, since, legacy, per_thread: None }
}

/// A row whose per-thread-stream flavour is a function of its own (`_ptsz`).
fn threaded(name: &'static CStr, since: c_int, legacy: *mut c_void, per_thread: *mut c_void) -> Row {
    Row { per_thread: Some(per_thread), ..row(name, since, legacy) }
}

fn rows() -> Vec<Row> {
    vec![
        row(c"cuInit", 2000, cuInit as *mut c_void),
        row(c"cuDriverGetVersion", 2020, cuDriverGetVersion as *mut c_void),
        row(c"cuGetProcAddress", 11030, cuGetProcAddress as *mut c_void),
        row(c"cuGetProcAddress", 12000, cuGetProcAddress_v2 as *mut c_void),
        row(c"cuDeviceGet", 2000, cuDeviceGet as *mut c_void),
        row(c"cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain as *mut c_void),
        row(c"cuCtxSetCurrent", 4000, cuCtxSetCurrent as *mut c_void),
        row(c"cuCtxCreate", 3020, cuCtxCreate_v2 as *mut c_void),
        row(c"cuCtxDestroy", 4000, cuCtxDestroy_v2 as *mut c_void),
        row(c"cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2 as *mut c_void),
        row(c"cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2 as *mut c_void),
        row(c"cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2 as *mut c_void),
        row(c"cuCtxGetDevice", 2000, cuCtxGetDevice as *mut c_void),
        row(c"cuCtxSynchronize", 2000, cuCtxSynchronize as *mut c_void),
        threaded(
            c"cuStreamSynchronize",
            2000,
            cuStreamSynchronize as *mut c_void,
            cuStreamSynchronize_ptsz as *mut c_void,
        ),
        row(c"cuMemAlloc", 3020, cuMemAlloc_v2 as *mut c_void),
        row(c"cuMemAllocPitch", 3020, cuMemAllocPitch_v2 as *mut c_void),
        row(c"cuMemFree", 3020, cuMemFree_v2 as *mut c_void),
        row(c"cuMemGetInfo", 3020, cuMemGetInfo_v2 as *mut c_void),
        row(c"cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2 as *mut c_void),
        row(c"cuMemcpyDtoD", 3020, cuMemcpyDtoD_v2 as *mut c_void),
        row(c"cuMemsetD8", 3020, cuMemsetD8_v2 as *mut c_void),
        row(c"cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2 as *mut c_void),
        row(c"cuMemAllocManaged", 6000, cuMemAllocManaged as *mut c_void),
        row(c"cuMemAddressReserve", 10020, cuMemAddressReserve as *mut c_void),
        row(c"cuMemAddressFree", 10020, cuMemAddressFree as *mut c_void),
        row(c"cuMemCreate", 10020, cuMemCreate as *mut c_void),
        row(c"cuMemRelease", 10020, cuMemRelease as *mut c_void),
        row(c"cuMemMap", 10020, cuMemMap as *mut c_void),
        row(c"cuMemRetainAllocationHandle", 11000, cuMemRetainAllocationHandle as *mut c_void),
        row(c"cuMemUnmap", 10020, cuMemUnmap as *mut c_void),
        row(c"cuMemSetAccess", 10020, cuMemSetAccess as *mut c_void),
        row(c"cuMemcpyDtoDAsync", 3020, cuMemcpyDtoDAsync_v2 as *mut c_void),
        row(c"cuStreamWriteValue32", 12000, cuStreamWriteValue32_v2 as *mut c_void),
        row(c"cuMemcpyBatchAsync", 13000, cuMemcpyBatchAsync_v2 as *mut c_void),
        row(c"cuEventSynchronize", 2000, cuEventSynchronize as *mut c_void),
        row(c"cuMemGetAddressRange", 3020, pointers::cuMemGetAddressRange_v2 as *mut c_void),
        row(c"cuPointerGetAttribute", 4000, pointers::cuPointerGetAttribute as *mut c_void),
        row(c"cuIpcGetMemHandle", 4010, ipc::cuIpcGetMemHandle as *mut c_void),
        row(c"cuIpcOpenMemHandle", 4010, ipc::cuIpcOpenMemHandle as *mut c_void),
        row(c"cuIpcOpenMemHandle", 11000, ipc::cuIpcOpenMemHandle_v2 as *mut c_void),
        row(c"cuIpcCloseMemHandle", 4010, ipc::cuIpcCloseMemHandle as *mut c_void),
        row(c"cuMemExportToShareableHandle", 10020, ipc::cuMemExportToShareableHandle as *mut c_void),
        row(c"cuMemImportFromShareableHandle", 10020, ipc::cuMemImportFromShareableHandle as *mut c_void),
        row(c"cuFuncGetParamInfo", 12040, cuFuncGetParamInfo as *mut c_void),
        row(c"cuKernelGetParamInfo", 12040, cuKernelGetParamInfo as *mut c_void),
        row(c"cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2 as *mut c_void),
        row(c"cuStreamEndCapture", 10000, cuStreamEndCapture as *mut c_void),
        threaded(
            c"cuStreamGetCaptureInfo",
            10010,
            cuStreamGetCaptureInfo as *mut c_void,
            cuStreamGetCaptureInfo_ptsz as *mut c_void,
        ),
        row(c"cuGraphInstantiate", 11000, cuGraphInstantiate_v2 as *mut c_void),
        row(c"cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags as *mut c_void),
        threaded(c"cuGraphLaunch", 10000, cuGraphLaunch as *mut c_void, cuGraphLaunch_ptsz as *mut c_void),
        row(c"cuGraphExecDestroy", 10000, cuGraphExecDestroy as *mut c_void),
        row(c"cuGraphDestroy", 10000, cuGraphDestroy as *mut c_void),
        threaded(c"cuLaunchKernel", 4000, cuLaunchKernel as *mut c_void, cuLaunchKernel_ptsz as *mut c_void),
        threaded(c"cuMemAllocAsync", 11020, cuMemAllocAsync as *mut c_void, cuMemAllocAsync_ptsz as *mut c_void),
        threaded(c"cuMemFreeAsync", 11020, cuMemFreeAsync as *mut c_void, cuMemFreeAsync_ptsz as *mut c_void),
        threaded(
            c"cuMemAllocFromPoolAsync",
            11020,
            pools::cuMemAllocFromPoolAsync as *mut c_void,
            pools::cuMemAllocFromPoolAsync_ptsz as *mut c_void,
        ),
        row(c"cuDeviceGetDefaultMemPool", 11020, pools::cuDeviceGetDefaultMemPool as *mut c_void),
        row(c"cuDeviceGetMemPool", 11020, pools::cuDeviceGetMemPool as *mut c_void),
        row(c"cuDeviceSetMemPool", 11020, pools::cuDeviceSetMemPool as *mut c_void),
        row(c"cuMemPoolCreate", 11020, pools::cuMemPoolCreate as *mut c_void),
        row(c"cuMemPoolDestroy", 11020, pools::cuMemPoolDestroy as *mut c_void),
        row(c"cuMemPoolTrimTo", 11020, pools::cuMemPoolTrimTo as *mut c_void),
        row(c"cuMemPoolSetAttribute", 11020, pools::cuMemPoolSetAttribute as *mut c_void),
        row(c"cuMemPoolGetAttribute", 11020, pools::cuMemPoolGetAttribute as *mut c_void),
    ]
}

/// The function `symbol` means for a caller of `version` with `flags`, or the query result why not.
fn resolve(symbol: &CStr, version: c_int, flags: u64) -> Result<*mut c_void, c_int> {
    let rows = rows();
    let named: Vec<&Row> = rows.iter().filter(|r| r.name == symbol).collect();
    if named.is_empty() {
        return Err(SYMBOL_NOT_FOUND);
    }
    let row = named.into_iter().filter(|r| r.since <= version).max_by_key(|r| r.since).ok_or(VERSION_NOT_SUFFICIENT)?;
    Ok(match (flags & PER_THREAD != 0, row.per_thread) {
        (true, Some(per_thread)) => per_thread,
        _ => row.legacy,
    })
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> Code {
    // SAFETY: passed on from the caller.
    unsafe { get_proc_address(symbol, pfn, version, flags, status) }
}

/// Both versions of `cuGetProcAddress` (neither calls the other's exported name: see `alloc_plain`).
///
/// # Safety
/// As the driver's.
unsafe fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> Code {
    if symbol.is_null() || pfn.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null; the caller passes a NUL-terminated name.
    let (found, query) = match resolve(unsafe { CStr::from_ptr(symbol) }, version, flags) {
        Ok(f) => (f, FOUND),
        Err(why) => (std::ptr::null_mut(), why),
    };
    // SAFETY: the caller's out-pointers (`status` may be null).
    unsafe {
        *pfn = found;
        if !status.is_null() {
            *status = query;
        }
    }
    if found.is_null() {
        CUDA_ERROR_NOT_FOUND
    } else {
        CUDA_SUCCESS
    }
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> Code {
    // SAFETY: the caller's arguments; no status wanted.
    unsafe { get_proc_address(symbol, pfn, version, flags, std::ptr::null_mut()) }
}
