//! The fake's driver, devices and contexts: `cuInit` (which reads the settings), versions,
//! error names, the GPUs (one, or two with `TIERMEM_FAKE_GPUS=2`: peers of each other), their
//! primary contexts (current per thread), and synchronizations, which only count (work is
//! never in flight).

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
        let memory = Memory::new(total, gpus_setting());
        *guard = Some(Fake { memory, settings: Settings { host_chunks } });
    }
    CUDA_SUCCESS
}

/// How many GPUs `TIERMEM_FAKE_GPUS` asks for: 2, or 1 for anything else (and by default).
fn gpus_setting() -> usize {
    match std::env::var("TIERMEM_FAKE_GPUS").as_deref().map(str::trim) {
        Ok("2") => 2,
        _ => 1,
    }
}

/// GPU `device`'s ordinal, if the fake has that GPU (device handles are ordinals).
fn gpu(fake: &Fake, device: c_int) -> Option<usize> {
    usize::try_from(device).ok().filter(|&gpu| gpu < fake.memory.gpus())
}

/// Runs `f` on the fake's state and GPU `device`'s ordinal; `CUDA_ERROR_INVALID_DEVICE` for a
/// GPU the fake does not have.
pub(crate) fn with_gpu(device: c_int, f: impl FnOnce(&mut Fake, usize) -> Code) -> Code {
    with(|fake| match gpu(fake, device) {
        Some(gpu) => f(fake, gpu),
        None => CUDA_ERROR_INVALID_DEVICE,
    })
}

/// Copies `text` (NUL-terminated) into the caller's buffer of `len` characters.
///
/// # Safety
/// `out` null or valid for `len` characters.
unsafe fn put_text(out: *mut c_char, len: c_int, text: &std::ffi::CStr) -> Code {
    let bytes = text.to_bytes_with_nul();
    if out.is_null() || usize::try_from(len).unwrap_or(0) < bytes.len() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: `out` holds at least `bytes.len()` characters (checked against `len`).
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), out, bytes.len()) };
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
    with(|fake| unsafe { put(count, fake.memory.gpus() as c_int) })
}

/// A GPU's PCI address: `0000:01:00.0` for GPU 0, `0000:02:00.0` for GPU 1 (the fake NVML says
/// the same).
///
/// # Safety
/// As the driver's: `out` valid for `len` characters.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(out: *mut c_char, len: c_int, device: c_int) -> Code {
    with_gpu(device, |_, gpu| {
        let text = if gpu == 0 { c"0000:01:00.0" } else { c"0000:02:00.0" };
        // SAFETY: the caller's buffer of `len` characters.
        unsafe { put_text(out, len, text) }
    })
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut c_int, ordinal: c_int) -> Code {
    // SAFETY: the caller's out-pointer; the handle of a GPU is its ordinal.
    with_gpu(ordinal, |_, _| unsafe { put(device, ordinal) })
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(value: *mut c_int, attribute: c_int, device: c_int) -> Code {
    const VMM_SUPPORTED: c_int = 102;
    const HOST_NUMA_ID: c_int = 134;
    const HOST_NUMA_VMM_SUPPORTED: c_int = 141;
    with_gpu(device, |fake, _| {
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
    // SAFETY: the caller's buffer of `len` bytes. The GPUs are of one model, as on a node.
    with_gpu(device, |_, _| unsafe { put_text(name, len, c"tiermem fake GPU") })
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, device: c_int) -> Code {
    // SAFETY: the caller's out-pointer.
    with_gpu(device, |fake, _| unsafe { put(bytes, fake.memory.total) })
}

/// 1 for two different GPUs the fake has (with two, each is the other's peer), else 0.
///
/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(can: *mut c_int, device: c_int, peer: c_int) -> Code {
    with(|fake| {
        let peers = matches!((gpu(fake, device), gpu(fake, peer)), (Some(a), Some(b)) if a != b);
        // SAFETY: the caller's out-pointer.
        unsafe { put(can, c_int::from(peers)) }
    })
}

/// GPU `gpu`'s primary context's handle.
fn primary(gpu: usize) -> usize {
    PRIMARY + gpu * PRIMARY_STRIDE
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut *mut c_void, device: c_int) -> Code {
    // SAFETY: the caller's out-pointer.
    with_gpu(device, |_, gpu| unsafe { put(ctx, primary(gpu) as *mut c_void) })
}

/// `cuDevicePrimaryCtxReset_v2`: the context's plain allocations freed and every event
/// destroyed (the fake's events are all the primary contexts'); VMM memory outlives it, as the
/// driver's does.
#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxReset_v2(device: c_int) -> Code {
    let code = with_gpu(device, |fake, gpu| {
        fake.memory.free_plain_of(primary(gpu));
        CUDA_SUCCESS
    });
    if code == CUDA_SUCCESS {
        crate::events::destroy_all();
    }
    code
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(device: c_int) -> Code {
    with_gpu(device, |_, _| CUDA_SUCCESS)
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut *mut c_void) -> Code {
    // SAFETY: the caller's out-pointer.
    with(|_| unsafe { put(ctx, CURRENT.with(Cell::get) as *mut c_void) })
}

/// Whether `ctx` is the primary context of a GPU the fake has, or a live one of the program's
/// (contexts.rs). GPU 0's primary is known even before `cuInit`, as it always was.
pub(crate) fn known_context(ctx: usize) -> bool {
    if ctx == PRIMARY || crate::contexts::gpu_of(ctx).is_some() {
        return true;
    }
    let mut known = false;
    with(|fake| {
        known = (1..fake.memory.gpus()).any(|gpu| primary(gpu) == ctx);
        CUDA_SUCCESS
    });
    known
}

#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: *mut c_void) -> Code {
    if !ctx.is_null() && !known_context(ctx as usize) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    CURRENT.with(|c| c.set(ctx as usize));
    CUDA_SUCCESS
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut c_int) -> Code {
    match current_context() {
        // SAFETY: the caller's out-pointer; the handle of a GPU is its ordinal.
        Ok(gpu) => unsafe { put(device, gpu as c_int) },
        Err(code) => code,
    }
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
    std::thread::sleep(crate::sync_delay());
    crate::contexts::synchronized(CURRENT.with(Cell::get));
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
