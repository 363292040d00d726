//! Memory shared between processes, as far as the fake goes: chunks made shareable as POSIX
//! file descriptors are exported as their memfd and imported from one (memory.rs), so that two
//! processes over the fake share bytes as two over the driver do. Legacy IPC
//! (`cuIpcGetMemHandle` and friends) answers `CUDA_ERROR_INVALID_VALUE` for everything: what
//! the driver answers for memory of the VMM API, which is all that tiermem serves, and the fake
//! has no other memory worth sharing.

use std::ffi::{c_int, c_uint, c_void};
use std::os::fd::{BorrowedFd, IntoRawFd};

use crate::*;

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
pub const POSIX_FD: c_int = 1;

/// `CUipcMemHandle`: 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IpcMemHandle {
    pub reserved: [u8; 64],
}

/// # Safety
/// As the driver's: `shareable` valid for writing an `int` (for a POSIX fd).
#[no_mangle]
pub unsafe extern "C" fn cuMemExportToShareableHandle(
    shareable: *mut c_void,
    handle: u64,
    handle_type: c_int,
    flags: u64,
) -> Code {
    if shareable.is_null() || handle_type != POSIX_FD || flags != 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    with(|fake| match fake.memory.export(handle) {
        // SAFETY: the caller's out-pointer, an `int` for this handle type; the caller owns the fd.
        Ok(fd) => unsafe { put(shareable.cast::<c_int>(), fd.into_raw_fd()) },
        Err(code) => code,
    })
}

/// # Safety
/// As the driver's: `handle` valid for a write; `os_handle` a descriptor's value.
#[no_mangle]
pub unsafe extern "C" fn cuMemImportFromShareableHandle(
    handle: *mut u64,
    os_handle: *mut c_void,
    handle_type: c_int,
) -> Code {
    let Ok(raw) = c_int::try_from(os_handle as usize) else { return CUDA_ERROR_INVALID_VALUE };
    if handle_type != POSIX_FD || raw < 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the caller's descriptor, open for the length of this call (the driver's contract).
    let fd = unsafe { BorrowedFd::borrow_raw(raw) };
    // SAFETY: the caller's out-pointer.
    with(|fake| unsafe { answer(handle, fake.memory.import(fd)) })
}

#[no_mangle]
pub extern "C" fn cuIpcGetMemHandle(_handle: *mut IpcMemHandle, _dptr: u64) -> Code {
    CUDA_ERROR_INVALID_VALUE
}

#[no_mangle]
pub extern "C" fn cuIpcOpenMemHandle(_dptr: *mut u64, _handle: IpcMemHandle, _flags: c_uint) -> Code {
    CUDA_ERROR_INVALID_VALUE
}

#[no_mangle]
pub extern "C" fn cuIpcOpenMemHandle_v2(_dptr: *mut u64, _handle: IpcMemHandle, _flags: c_uint) -> Code {
    CUDA_ERROR_INVALID_VALUE
}

#[no_mangle]
pub extern "C" fn cuIpcCloseMemHandle(_dptr: u64) -> Code {
    CUDA_ERROR_INVALID_VALUE
}
