//! Where chunks can live and who may touch them, in the driver's terms: the allocation
//! properties of a chunk at a [`ChunkLocation`] (`CU_MEM_LOCATION_TYPE_DEVICE` with the GPU's
//! device handle, or `CU_MEM_LOCATION_TYPE_HOST_NUMA` on the NUMA node closest to this GPU),
//! and the access descriptors of a list of GPUs for `cuMemSetAccess`.
//!
//! Host-located chunks are probed once when the device opens (`probe_host`): the driver must
//! say it supports VMM allocations on host NUMA nodes (CUDA 12.4 or newer drivers), and their
//! granularity must divide this GPU's, so that a host chunk is one granule like every other.
//! If not, `create_chunk_at(Host)` is `Unsupported`, with the probe's reason. A chunk on another
//! GPU is assumed to have this GPU's granularity (GPUs of one node are of one model).

use std::ptr;

use cudarc::driver::sys::{self, CUresult};

use super::driver::error_name;
use super::CudaDevice;
use crate::{ChunkLocation, DeviceError, Result};

/// The properties of a pinned chunk at `location`, with no shareable handle.
pub(super) fn allocation_prop(location: sys::CUmemLocation) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location,
        win32HandleMetaData: ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// The location of GPU `dev`'s HBM.
pub(super) fn device_location(dev: sys::CUdevice) -> sys::CUmemLocation {
    sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: dev }
}

/// The properties of host-located chunks for GPU `dev` (whose chunks are `granularity`
/// bytes), or why there are none.
pub(super) fn probe_host(dev: sys::CUdevice, granularity: usize) -> Result<sys::CUmemAllocationProp, String> {
    let attribute = |attr: sys::CUdevice_attribute| {
        let mut value = 0;
        // SAFETY: valid out-pointer and device; an attribute the driver does not know is an
        // error code, not undefined behaviour.
        match unsafe { sys::cuDeviceGetAttribute(&mut value, attr, dev) } {
            CUresult::CUDA_SUCCESS => Ok(value),
            r => Err(format!("cuDeviceGetAttribute({attr:?}) failed: {}", error_name(r))),
        }
    };
    use sys::CUdevice_attribute::{
        CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID as NUMA_ID,
        CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED as HOST_VMM,
    };
    if attribute(HOST_VMM)? == 0 {
        return Err("the driver does not support VMM allocations in host memory \
                    (CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 0)"
            .to_string());
    }
    // -1 where the system has no NUMA: cuMemCreate then wants node 0.
    let numa = attribute(NUMA_ID)?.max(0);
    let location = sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA, id: numa };
    let prop = allocation_prop(location);
    let mut host_granularity = 0usize;
    let minimum = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
    // SAFETY: valid out-pointer; `prop` is a fully initialised allocation description.
    let r = unsafe { sys::cuMemGetAllocationGranularity(&mut host_granularity, &prop, minimum) };
    if r != CUresult::CUDA_SUCCESS {
        return Err(format!("cuMemGetAllocationGranularity(HOST_NUMA node {numa}) failed: {}", error_name(r)));
    }
    if host_granularity == 0 || !granularity.is_multiple_of(host_granularity) {
        return Err(format!(
            "host chunks on NUMA node {numa} have a granularity of {host_granularity} B, which does \
             not divide the GPU's {granularity} B"
        ));
    }
    Ok(prop)
}

/// The allocation properties of a chunk of `device`'s at `location`.
pub(super) fn chunk_prop(device: &CudaDevice, location: ChunkLocation) -> Result<sys::CUmemAllocationProp> {
    match location {
        ChunkLocation::Gpu(ordinal) if ordinal == device.info.ordinal => Ok(device.prop),
        ChunkLocation::Gpu(ordinal) => {
            let dev = device_handle(device, "cuMemCreate", ordinal)?;
            Ok(allocation_prop(device_location(dev)))
        }
        ChunkLocation::Host => device
            .host_prop
            .clone()
            .map_err(|why| DeviceError::Unsupported(format!("cuMemCreate in host memory: {why}"))),
    }
}

/// One read-write access descriptor per GPU of `gpus`.
pub(super) fn access_descs(device: &CudaDevice, gpus: &[usize]) -> Result<Vec<sys::CUmemAccessDesc>> {
    if gpus.is_empty() {
        return Err(DeviceError::Driver {
            call: "cuMemSetAccess",
            code: "CUDA_ERROR_INVALID_VALUE".into(),
            detail: "no GPU to give access to".into(),
        });
    }
    gpus.iter()
        .map(|&ordinal| {
            Ok(sys::CUmemAccessDesc {
                location: device_location(device_handle(device, "cuMemSetAccess", ordinal)?),
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            })
        })
        .collect()
}

/// The driver's handle of GPU `ordinal`, for `call`'s error if there is no such GPU.
fn device_handle(device: &CudaDevice, call: &'static str, ordinal: usize) -> Result<sys::CUdevice> {
    device.devices.get(ordinal).copied().ok_or_else(|| DeviceError::Driver {
        call,
        code: "CUDA_ERROR_INVALID_DEVICE".into(),
        detail: format!("GPU {ordinal}, but the driver sees {} GPU(s)", device.devices.len()),
    })
}
