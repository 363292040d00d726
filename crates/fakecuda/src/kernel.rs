//! The fake's kernels, asynchronous device copies and injected failures.
//!
//! A kernel is a handle the test registers with `tiermem_fake_kernel` (not a driver function):
//! its parameters' sizes, which `cuFuncGetParamInfo` answers (`cuKernelGetParamInfo` for one
//! registered as a library kernel, a `CUkernel`), and whether it writes. A launch
//! runs at once, as the GPU would at some point: each parameter of 8 bytes whose value is an
//! address in a reservation of the fake is dereferenced, as the kernel would — read, or
//! incremented by one if the kernel writes. An address whose chunk is not mapped with access at
//! that moment is what a GPU faults on: the launch answers `CUDA_ERROR_ILLEGAL_ADDRESS`. So a
//! test that launches while chunks are remapped sees a fault exactly when a real kernel could
//! have touched a chunk mid-move. Parameters of other sizes are only there to be scanned.
//!
//! `tiermem_fake_fail(name, nth)` makes the `nth` call from now of `cuMemMap`, `cuMemSetAccess`
//! or `cuMemcpyDtoDAsync_v2` fail, for tests of what a failure mid-migration leaves behind;
//! `cuMemcpyDtoDAsync_v2:corrupt` makes that copy succeed with one byte of its destination wrong.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::{Mutex, MutexGuard};

use crate::*;

pub const CUDA_ERROR_INVALID_HANDLE: Code = 400;
pub const CUDA_ERROR_ILLEGAL_ADDRESS: Code = 700;
pub const CUDA_ERROR_UNKNOWN: Code = 999;

struct Kernel {
    sizes: Vec<usize>,
    writes: bool,
    /// A library kernel (`CUkernel`): `cuKernelGetParamInfo` knows it, `cuFuncGetParamInfo` not.
    library: bool,
}

struct Kernels {
    by_handle: HashMap<usize, Kernel>,
    /// The call to fail, and after how many more calls of it.
    fail: Option<(String, usize)>,
}

static KERNELS: Mutex<Option<Kernels>> = Mutex::new(None);

fn kernels() -> MutexGuard<'static, Option<Kernels>> {
    KERNELS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether this call of `name` is the one to fail (counts it down).
pub(crate) fn injected(name: &str) -> bool {
    let mut guard = kernels();
    let Some((target, left)) = guard.as_mut().and_then(|k| k.fail.as_mut()) else { return false };
    if target != name {
        return false;
    }
    *left -= 1;
    let now = *left == 0;
    if let (true, Some(kernels)) = (now, guard.as_mut()) {
        kernels.fail = None;
    }
    now
}

/// Registers kernel `handle` with `count` parameters of `sizes`; bit 0 of `flags` set if it
/// writes, bit 1 if it is a library kernel (a `CUkernel`, whose parameters only
/// `cuKernelGetParamInfo` answers). Not a driver function.
///
/// # Safety
/// `sizes` valid for `count` reads.
#[no_mangle]
pub unsafe extern "C" fn tiermem_fake_kernel(
    handle: *mut c_void,
    sizes: *const usize,
    count: usize,
    flags: c_int,
) -> Code {
    if sizes.is_null() && count > 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the caller's array of `count` sizes (none read when `count` is 0).
    let sizes = if count == 0 { Vec::new() } else { unsafe { std::slice::from_raw_parts(sizes, count) }.to_vec() };
    let mut guard = kernels();
    let k = guard.get_or_insert_with(|| Kernels { by_handle: HashMap::new(), fail: None });
    k.by_handle.insert(handle as usize, Kernel { sizes, writes: flags & 1 != 0, library: flags & 2 != 0 });
    CUDA_SUCCESS
}

/// Makes the `nth` (1 for the next) call of `name` from now fail. Not a driver function.
///
/// # Safety
/// `name` NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn tiermem_fake_fail(name: *const c_char, nth: usize) -> Code {
    if name.is_null() || nth == 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null; NUL-terminated by the caller's contract.
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned();
    let mut guard = kernels();
    guard.get_or_insert_with(|| Kernels { by_handle: HashMap::new(), fail: None }).fail = Some((name, nth));
    CUDA_SUCCESS
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuFuncGetParamInfo(
    f: *mut c_void,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> Code {
    // SAFETY: the caller's out-pointers, passed on.
    unsafe { param_info(f, false, index, offset, size) }
}

/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuKernelGetParamInfo(
    f: *mut c_void,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> Code {
    // SAFETY: the caller's out-pointers, passed on.
    unsafe { param_info(f, true, index, offset, size) }
}

/// Parameter `index` of kernel `f`, if it is a library kernel exactly when `library`.
///
/// # Safety
/// `offset` and `size` valid for writes.
unsafe fn param_info(f: *mut c_void, library: bool, index: usize, offset: *mut usize, size: *mut usize) -> Code {
    let guard = kernels();
    let known = guard.as_ref().and_then(|k| k.by_handle.get(&(f as usize)));
    let Some(kernel) = known.filter(|k| k.library == library) else {
        return CUDA_ERROR_INVALID_HANDLE;
    };
    let Some(&bytes) = kernel.sizes.get(index) else { return CUDA_ERROR_INVALID_VALUE };
    let at = kernel.sizes[..index].iter().sum::<usize>();
    // SAFETY: the caller's out-pointers.
    match unsafe { put(offset, at) } {
        // SAFETY: as above.
        CUDA_SUCCESS => unsafe { put(size, bytes) },
        code => code,
    }
}

/// The sizes of kernel `f`'s parameters, if it is registered.
pub(crate) fn sizes(f: *mut c_void) -> Option<Vec<usize>> {
    kernels().as_ref().and_then(|k| k.by_handle.get(&(f as usize))).map(|kernel| kernel.sizes.clone())
}

/// Runs kernel `f` with `params` (module documentation).
///
/// # Safety
/// `params` null or one pointer per parameter of `f`, each to a value of that parameter's size.
pub(crate) unsafe fn run(f: *mut c_void, params: *mut *mut c_void) -> Code {
    if let Err(code) = current_context() {
        return code;
    }
    let (sizes, writes) = match kernels().as_ref().and_then(|k| k.by_handle.get(&(f as usize))) {
        Some(kernel) => (kernel.sizes.clone(), kernel.writes),
        None => return CUDA_ERROR_INVALID_HANDLE,
    };
    if params.is_null() {
        return CUDA_SUCCESS; // arguments packed in `extra`: nothing is dereferenced
    }
    let mut on_host = 0u32;
    let code = with(|fake| {
        for (index, _) in sizes.iter().enumerate().filter(|&(_, &size)| size == 8) {
            // SAFETY: one entry per parameter, each pointing to its 8-byte value.
            let address = unsafe { (*params.add(index)).cast::<u64>().read_unaligned() };
            if !fake.memory.reserved(address, 8) {
                continue; // a scalar, or host memory: not the fake GPU's to check
            }
            if !fake.memory.accessible(address, 8) {
                return CUDA_ERROR_ILLEGAL_ADDRESS;
            }
            on_host += u32::from(fake.memory.location(address) == Some(crate::memory::Place::Host));
            let word = address as *mut u64;
            // SAFETY: 8 bytes of fake device memory mapped read-write (checked), under the fake's lock.
            unsafe { word.write_unaligned(word.read_unaligned().wrapping_add(u64::from(writes))) };
        }
        CUDA_SUCCESS
    });
    // Reading host memory over the link takes time (TIERMEM_FAKE_HOST_READ_US), the lock released.
    std::thread::sleep(crate::host_read_delay() * on_host);
    code
}

/// `cuLaunchKernel` and its per-thread variant: the same launch (work is never in flight), or
/// recorded into the graph its stream's capture makes (graphs.rs).
macro_rules! launches {
    ($($name:ident),*) => {$(
        /// # Safety
        /// As the driver's.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            f: *mut c_void,
            _gx: c_uint,
            _gy: c_uint,
            _gz: c_uint,
            _bx: c_uint,
            _by: c_uint,
            _bz: c_uint,
            _shared: c_uint,
            stream: *mut c_void,
            params: *mut *mut c_void,
            _extra: *mut *mut c_void,
        ) -> Code {
            // SAFETY: passed on from the caller (a launch on a stream being captured is recorded).
            unsafe { crate::graphs::captured(stream, f, params).unwrap_or_else(|| run(f, params)) }
        }
    )*};
}

launches!(cuLaunchKernel, cuLaunchKernel_ptsz);

/// Copies at once (work is never in flight in the fake).
#[no_mangle]
pub extern "C" fn cuMemcpyDtoDAsync_v2(dst: u64, src: u64, len: usize, _stream: *mut c_void) -> Code {
    if injected("cuMemcpyDtoDAsync_v2") {
        return CUDA_ERROR_UNKNOWN;
    }
    let copied = copy_device(dst, src, len);
    if copied == CUDA_SUCCESS && len > 0 && injected("cuMemcpyDtoDAsync_v2:corrupt") {
        // A copy that reports success with one byte wrong: what only a check of the bytes sees.
        let at = dst + len as u64 / 2;
        crate::with(|fake| {
            if fake.memory.accessible(at, 1) {
                // SAFETY: one byte of fake device memory mapped read-write (checked).
                unsafe { *(at as *mut u8) ^= 0x5a };
            }
            CUDA_SUCCESS
        });
    }
    copied
}

/// `cuStreamWriteValue32_v2`: writes `value` at `address` at once (work is never in flight).
#[no_mangle]
pub extern "C" fn cuStreamWriteValue32_v2(_stream: *mut c_void, address: u64, value: u32, _flags: c_uint) -> Code {
    with(|fake| {
        if !fake.memory.accessible(address, 4) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: 4 bytes of fake device memory mapped read-write (checked), under the fake's lock.
        unsafe { (address as *mut u32).write_unaligned(value) };
        CUDA_SUCCESS
    })
}

/// `cuMemcpyBatchAsync_v2` (CUDA 13), between ranges of fake device memory only: each copy at
/// once, the attributes ignored.
///
/// # Safety
/// As the driver's: `dsts`, `srcs` and `sizes` hold `count` entries each.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyBatchAsync_v2(
    dsts: *const u64,
    srcs: *const u64,
    sizes: *const usize,
    count: usize,
    _attrs: *const c_void,
    _attr_indices: *const usize,
    _attr_count: usize,
    _stream: *mut c_void,
) -> Code {
    if count == 0 || dsts.is_null() || srcs.is_null() || sizes.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    for i in 0..count {
        // SAFETY: `count` entries each (the caller's contract).
        let (dst, src, len) = unsafe { (*dsts.add(i), *srcs.add(i), *sizes.add(i)) };
        let copied = copy_device(dst, src, len);
        if copied != CUDA_SUCCESS {
            return copied;
        }
    }
    CUDA_SUCCESS
}
