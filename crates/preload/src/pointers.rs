//! What a program learns about a pointer into tiermem's memory: `cuMemGetAddressRange_v2` and
//! `cuPointerGetAttribute`'s range and legacy-IPC attributes, answered for the allocation the
//! program made, as the driver answers for `cuMemAlloc` memory.
//!
//! The driver's own answers for tiermem's memory would be those of VMM memory, which differ
//! (measured on the H200, `scripts/gpu/probes/address_range.py`): `cuMemGetAddressRange` gives
//! the one physical chunk holding the pointer — a 32 MiB piece of the allocation, so a program
//! computing an offset from the "base" (NCCL's and UCX's registration, IPC offsets) gets it
//! wrong for every pointer past the first chunk; `cuPointerGetAttribute` gives the reservation,
//! rounded up to 2 MiB, as the range; and it says VMM memory is not legacy-IPC capable, which
//! tiermem's is (ipc.rs). Every other attribute, and every pointer tiermem did not allocate,
//! goes to the driver.
//!
//! And `cuMemRetainAllocationHandle`, which the driver answers for VMM memory only (an address
//! mapped by `cuMemMap`) and refuses for `cuMemAlloc` memory: for tiermem's memory it refuses
//! too (`CUDA_ERROR_INVALID_VALUE`). Libraries ask it to tell VMM memory from `cudaMalloc`
//! memory and to take the physical chunk under an address — UCX's and MSCCL++'s registration
//! export it to other processes, NCCL's user-buffer registration maps it — and a chunk so taken
//! would be left behind by tiermem's next move of that address (peers writing into memory tiermem
//! let go, NCCL's graph replays hanging). Refused, they take the path they take for `cudaMalloc`
//! memory: legacy IPC handles, which tiermem serves and never moves once shared (ipc.rs).

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use crate::boundary::{
    guard, inside, to_driver, CuResult, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_INITIALIZED, CUDA_SUCCESS,
};
use crate::driver::driver;
use crate::process;
use crate::wrappers::cached_entry;

const LEGACY_IPC_CAPABLE: c_int = 10;
const RANGE_START_ADDR: c_int = 11;
const RANGE_SIZE: c_int = 12;

/// The start and requested size of the tiermem allocation holding `ptr`.
fn allocation_of(ptr: u64) -> Option<(u64, usize)> {
    process::lock().books.containing(ptr).map(|a| (a.va, a.requested))
}

/// `cuMemGetAddressRange_v2`: for tiermem's memory, the allocation the program made.
///
/// # Safety
/// As the driver's: out-pointers null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(base: *mut u64, size: *mut usize, dptr: u64) -> CuResult {
    let Some(real) = driver().and_then(|d| d.mem_get_address_range) else { return CUDA_ERROR_NOT_INITIALIZED };
    // SAFETY: the caller's arguments, as the driver takes them.
    let to_real = || to_driver(|| unsafe { real(base, size, dptr) });
    if inside() {
        return to_real();
    }
    guard("cuMemGetAddressRange_v2", || match allocation_of(dptr) {
        None => to_real(),
        Some((start, bytes)) => {
            // SAFETY: the caller's out-pointers, each written only if given.
            unsafe {
                if !base.is_null() {
                    base.write(start);
                }
                if !size.is_null() {
                    size.write(bytes);
                }
            }
            CUDA_SUCCESS
        }
    })
}

/// `cuPointerGetAttribute`: the range and legacy-IPC capability of tiermem's memory as the
/// program's allocation has them; the rest is the driver's.
///
/// # Safety
/// As the driver's: `data` null or valid for a write of the attribute's type.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(data: *mut c_void, attribute: c_int, ptr: u64) -> CuResult {
    let Some(real) = driver().and_then(|d| d.pointer_get_attribute) else { return CUDA_ERROR_NOT_INITIALIZED };
    // SAFETY: the caller's arguments, as the driver takes them.
    let to_real = || to_driver(|| unsafe { real(data, attribute, ptr) });
    let ours = matches!(attribute, LEGACY_IPC_CAPABLE | RANGE_START_ADDR | RANGE_SIZE);
    if inside() || data.is_null() || !ours {
        return to_real();
    }
    guard("cuPointerGetAttribute", || match allocation_of(ptr) {
        None => to_real(),
        Some((start, bytes)) => {
            // SAFETY: checked non-null; the caller's out-pointer, of the attribute's type (cuda.h).
            unsafe {
                match attribute {
                    RANGE_START_ADDR => data.cast::<u64>().write(start),
                    RANGE_SIZE => data.cast::<usize>().write(bytes),
                    _ => data.cast::<c_int>().write(c_int::from(crate::ipc::shareable())),
                }
            }
            CUDA_SUCCESS
        }
    })
}

type RetainFn = unsafe extern "C" fn(*mut u64, *mut c_void) -> CuResult;

/// `cuMemRetainAllocationHandle`: refused for tiermem's memory, as the driver refuses it for
/// `cuMemAlloc` memory (module documentation); the driver's answer for anything else.
///
/// # Safety
/// As the driver's: `handle` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(handle: *mut u64, addr: *mut c_void) -> CuResult {
    static REAL: OnceLock<Option<RetainFn>> = OnceLock::new();
    let Some(real) = cached_entry(&REAL, "cuMemRetainAllocationHandle\0") else { return CUDA_ERROR_NOT_INITIALIZED };
    // SAFETY: the caller's arguments, as the driver takes them.
    let to_real = || to_driver(|| unsafe { real(handle, addr) });
    if inside() {
        return to_real();
    }
    guard("cuMemRetainAllocationHandle", || match allocation_of(addr as u64) {
        Some(_) => CUDA_ERROR_INVALID_VALUE,
        None => to_real(),
    })
}
