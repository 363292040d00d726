//! What the fake says about a device pointer, as the driver does (measured on the H200,
//! `scripts/gpu/probes/address_range.py`): `cuMemGetAddressRange_v2` gives a plain allocation,
//! or for VMM memory the one mapping (physical chunk) holding the pointer; `cuPointerGetAttribute`
//! gives the reservation as its range, and legacy IPC capability only to plain allocations.

use std::ffi::{c_int, c_void};

use crate::*;

const LEGACY_IPC_CAPABLE: c_int = 10;
const RANGE_START_ADDR: c_int = 11;
const RANGE_SIZE: c_int = 12;

/// # Safety
/// As the driver's: out-pointers null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(base: *mut u64, size: *mut usize, ptr: u64) -> Code {
    with(|fake| match fake.memory.range(ptr) {
        None => CUDA_ERROR_INVALID_VALUE,
        Some(((start, bytes), _)) => {
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

/// # Safety
/// As the driver's: `data` valid for a write of the attribute's type.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(data: *mut c_void, attribute: c_int, ptr: u64) -> Code {
    if data.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    with(|fake| {
        let Some((mapping, reservation)) = fake.memory.range(ptr) else { return CUDA_ERROR_INVALID_VALUE };
        let range = reservation.unwrap_or(mapping);
        // SAFETY: the caller's out-pointer, of the attribute's type (cuda.h).
        unsafe {
            match attribute {
                RANGE_START_ADDR => data.cast::<u64>().write(range.0),
                RANGE_SIZE => data.cast::<usize>().write(range.1),
                LEGACY_IPC_CAPABLE => data.cast::<c_int>().write(c_int::from(reservation.is_none())),
                _ => return CUDA_ERROR_NOT_SUPPORTED,
            }
        }
        CUDA_SUCCESS
    })
}
