//! The fake's driver, devices and contexts: `cuInit` (which reads the settings), versions,
//! error names, one GPU, its primary context (current per thread), and synchronizations, which
//! only count (work is never in flight).

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::Ordering::Relaxed;

use crate::memory::Memory;
use crate::*;

#[no_mangle]
pub extern "C" fn cuInit(flags: c_uint) -> Code {
    if flags != 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let mut guard = FAKE.lock().unwrap_or_else(|p| p.into_inner());
    if guard.is_none() {
        let total = std::env::var("TIERMEM_FAKE_HBM").ok().and_then(|t| parse_bytes(&t)).unwrap_or(1 << 30);
        let host_chunks = std::env::var("TIERMEM_FAKE_HOST_CHUNKS").map_or(true, |v| v != "0");
        *guard = Some(Fake { memory: Memory::new(total), settings: Settings { host_chunks } });
    }
    CUDA_SUCCESS
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> Code {
    // SAFETY: the caller's out-pointer.
    unsafe { put(version, 13000) }
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(code: Code, name: *mut *const c_char) -> Code {
    let text: &'static std::ffi::CStr = match code {
        CUDA_SUCCESS => c"CUDA_SUCCESS",
        CUDA_ERROR_INVALID_VALUE => c"CUDA_ERROR_INVALID_VALUE",
        CUDA_ERROR_OUT_OF_MEMORY => c"CUDA_ERROR_OUT_OF_MEMORY",
        CUDA_ERROR_NOT_INITIALIZED => c"CUDA_ERROR_NOT_INITIALIZED",
        CUDA_ERROR_INVALID_DEVICE => c"CUDA_ERROR_INVALID_DEVICE",
        CUDA_ERROR_INVALID_CONTEXT => c"CUDA_ERROR_INVALID_CONTEXT",
        CUDA_ERROR_NOT_FOUND => c"CUDA_ERROR_NOT_FOUND",
        CUDA_ERROR_NOT_SUPPORTED => c"CUDA_ERROR_NOT_SUPPORTED",
        _ => return CUDA_ERROR_INVALID_VALUE,
    };
    // SAFETY: the caller's out-pointer; the string is static.
    unsafe { put(name, text.as_ptr()) }
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> Code {
    // SAFETY: the caller's out-pointer.
    with(|_| unsafe { put(count, 1) })
}

/// The one GPU's PCI address, `0000:01:00.0` (the fake NVML says the same).
///
/// # Safety
/// As the driver's: `out` valid for `len` characters.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(out: *mut c_char, len: c_int, device: c_int) -> Code {
    let text = b"0000:01:00.0\0";
    if out.is_null() || device != 0 || (len as usize) < text.len() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked: `out` holds at least `text.len()` characters.
    unsafe { std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), out, text.len()) };
    CUDA_SUCCESS
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut c_int, ordinal: c_int) -> Code {
    if ordinal != 0 {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    // SAFETY: the caller's out-pointer.
    with(|_| unsafe { put(device, 0) })
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(value: *mut c_int, attribute: c_int, device: c_int) -> Code {
    const VMM_SUPPORTED: c_int = 102;
    const HOST_NUMA_ID: c_int = 134;
    const HOST_NUMA_VMM_SUPPORTED: c_int = 141;
    if device != 0 {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    with(|fake| {
        let v = match attribute {
            VMM_SUPPORTED => 1,
            HOST_NUMA_ID => 0,
            HOST_NUMA_VMM_SUPPORTED => c_int::from(fake.settings.host_chunks),
            _ => 0,
        };
        // SAFETY: the caller's out-pointer.
        unsafe { put(value, v) }
    })
}

/// # Safety
/// As the driver's: `name` holds `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, device: c_int) -> Code {
    let text = b"tiermem fake GPU\0";
    if name.is_null() || device != 0 || usize::try_from(len).unwrap_or(0) < text.len() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: `name` holds at least `text.len()` bytes (checked against `len`).
    unsafe { std::ptr::copy_nonoverlapping(text.as_ptr().cast(), name, text.len()) };
    CUDA_SUCCESS
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, device: c_int) -> Code {
    if device != 0 {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    // SAFETY: the caller's out-pointer.
    with(|fake| unsafe { put(bytes, fake.memory.total) })
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(can: *mut c_int, _device: c_int, _peer: c_int) -> Code {
    // SAFETY: the caller's out-pointer.
    with(|_| unsafe { put(can, 0) })
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut *mut c_void, device: c_int) -> Code {
    if device != 0 {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    // SAFETY: the caller's out-pointer.
    with(|_| unsafe { put(ctx, PRIMARY as *mut c_void) })
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(device: c_int) -> Code {
    if device != 0 {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    with(|_| CUDA_SUCCESS)
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut *mut c_void) -> Code {
    // SAFETY: the caller's out-pointer.
    with(|_| unsafe { put(ctx, CURRENT.with(Cell::get) as *mut c_void) })
}

#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: *mut c_void) -> Code {
    if !ctx.is_null() && ctx as usize != PRIMARY {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    CURRENT.with(|c| c.set(ctx as usize));
    CUDA_SUCCESS
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut c_int) -> Code {
    if let Err(code) = current_context() {
        return code;
    }
    // SAFETY: the caller's out-pointer.
    unsafe { put(device, 0) }
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) -> Code {
    // SAFETY: the caller's out-pointers.
    match unsafe { put(least, 0) } {
        // SAFETY: the caller's out-pointer.
        CUDA_SUCCESS => unsafe { put(greatest, 0) },
        code => code,
    }
}

#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> Code {
    CONTEXT_SYNCS.fetch_add(1, Relaxed);
    current_context().err().unwrap_or(CUDA_SUCCESS)
}

/// Streams are handles and nothing more: the fake's copies and kernels complete when called.
///
/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    stream: *mut *mut c_void,
    _flags: c_uint,
    _priority: c_int,
) -> Code {
    static NEXT: AtomicUsize = AtomicUsize::new(0x5000);
    if stream.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if let Err(code) = current_context() {
        return code;
    }
    // SAFETY: checked non-null; the caller's out-pointer.
    unsafe { *stream = NEXT.fetch_add(0x10, Relaxed) as *mut c_void };
    CUDA_SUCCESS
}

#[no_mangle]
pub extern "C" fn cuStreamDestroy_v2(stream: *mut c_void) -> Code {
    if stream.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    CUDA_SUCCESS
}

#[no_mangle]
pub extern "C" fn cuStreamSynchronize(stream: *mut c_void) -> Code {
    stream_synchronized(stream)
}

#[no_mangle]
pub extern "C" fn cuStreamSynchronize_ptsz(stream: *mut c_void) -> Code {
    stream_synchronized(stream)
}

/// Captures record nothing (the fake has no graphs); they exist so that tests can begin and
/// end one around other calls.
#[no_mangle]
pub extern "C" fn cuStreamBeginCapture_v2(_stream: *mut c_void, _mode: c_int) -> Code {
    current_context().err().unwrap_or(CUDA_SUCCESS)
}

/// # Safety
/// As the driver's: `graph` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(_stream: *mut c_void, graph: *mut *mut c_void) -> Code {
    // SAFETY: the caller's out-pointer: no graph.
    unsafe { put(graph, std::ptr::null_mut()) }
}
