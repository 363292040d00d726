//! DLPack export: `torch.from_dlpack(buffer)`, `cupy.from_dlpack`, `numpy.from_dlpack` wrap a
//! buffer's bytes with no copy.
//!
//! The exported tensor is one dimension of `size` bytes (`uint8`) at the buffer's device
//! address, on `kDLCUDA` (or `kDLCPU` on the simulated device, whose "device memory" is host
//! memory). The capsule owns a reference to the `Buffer`, so the memory stays allocated while
//! any tensor made from it lives, even after the Python `Buffer` object is gone. As with the
//! CUDA Array Interface, the bytes are only usable while the buffer is acquired.
//!
//! This is the unversioned DLPack ABI (capsule name `"dltensor"`, DLPack 0.8), which every
//! consumer accepts; the consumer renames a capsule it took to `"used_dltensor"` and calls its
//! deleter, and a capsule never taken is deleted by its destructor.

use crate::buffer::Buffer;
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_void, CStr};

const K_DL_CPU: i32 = 1;
const K_DL_CUDA: i32 = 2;
const K_DL_UINT: u8 = 1;
const CAPSULE_NAME: &CStr = c"dltensor";

#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// What a capsule keeps alive: the buffer, and the shape array the tensor points into.
struct Holder {
    _buffer: Py<Buffer>,
    shape: [i64; 1],
}

/// The `__dlpack_device__` pair for this buffer: (device type, device id).
pub fn device(buffer: &Buffer) -> (i32, i32) {
    match buffer.engine.device_info().backend {
        tiermem::mechanism::BackendKind::Cuda => (K_DL_CUDA, buffer.engine.device_info().ordinal as i32),
        tiermem::mechanism::BackendKind::Sim => (K_DL_CPU, 0),
    }
}

/// A new `"dltensor"` capsule over `buffer`.
pub fn capsule(py: Python<'_>, buffer: Py<Buffer>) -> PyResult<PyObject> {
    let (ptr, size, dev) = {
        let b = buffer.get();
        (b.ptr(), b.size(), device(b))
    };
    let mut holder = Box::new(Holder { _buffer: buffer, shape: [size as i64] });
    let shape = holder.shape.as_mut_ptr();
    let managed = Box::into_raw(Box::new(DLManagedTensor {
        dl_tensor: DLTensor {
            data: ptr as *mut c_void,
            device: DLDevice { device_type: dev.0, device_id: dev.1 },
            ndim: 1,
            dtype: DLDataType { code: K_DL_UINT, bits: 8, lanes: 1 },
            shape,
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        },
        manager_ctx: Box::into_raw(holder).cast(),
        deleter: Some(delete_managed),
    }));
    // SAFETY: `managed` is a valid heap pointer; the name is a static C string; the destructor
    // frees `managed` only if no consumer took it (a consumer renames the capsule).
    let raw = unsafe { ffi::PyCapsule_New(managed.cast(), CAPSULE_NAME.as_ptr(), Some(capsule_destructor)) };
    if raw.is_null() {
        // SAFETY: the capsule was not created, so `managed` is still ours alone.
        unsafe { delete_managed(managed) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `raw` is a new, owned reference returned by PyCapsule_New.
    Ok(unsafe { PyObject::from_owned_ptr(py, raw) })
}

/// The DLPack deleter: frees the tensor and drops its reference to the buffer.
unsafe extern "C" fn delete_managed(managed: *mut DLManagedTensor) {
    if managed.is_null() {
        return;
    }
    // SAFETY: `managed` came from Box::into_raw in `capsule` and is deleted exactly once
    // (by the consumer, or by the capsule's destructor when no consumer took it).
    let managed = unsafe { Box::from_raw(managed) };
    // SAFETY: `manager_ctx` is the Box<Holder> leaked in `capsule`.
    let holder = unsafe { Box::from_raw(managed.manager_ctx.cast::<Holder>()) };
    // Dropping a Py<Buffer> needs the GIL; a consumer may call the deleter without it.
    Python::with_gil(|_| drop(holder));
}

/// The capsule's destructor: deletes the tensor unless a consumer took it.
unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with the capsule being destroyed; the checks below read only it.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, CAPSULE_NAME.as_ptr()) == 1 {
            let managed = ffi::PyCapsule_GetPointer(capsule, CAPSULE_NAME.as_ptr()).cast::<DLManagedTensor>();
            delete_managed(managed);
        }
    }
}
