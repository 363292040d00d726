//! The CUDA backend: the [`Device`](crate::Device) trait on the CUDA driver API, through the raw
//! `cudarc::driver::sys` bindings loaded at run time (so builds need no CUDA, and a machine
//! without `libcuda.so` gets [`DeviceError::NoDriver`] instead of a panic). `open` checks that
//! the library loads and exports every entry point used here, retains the device's primary
//! context (shared with the CUDA runtime, hence with PyTorch) and probes the device once into a
//! [`DeviceInfo`]; every method then makes that context current on the calling thread, restoring
//! a different context it found there. Physical chunks are VMM allocations of exactly one
//! granule (`cuMemCreate`, pinned, located on this GPU, another GPU or host memory: see
//! `locations`), mapped into reservations from `cuMemAddressReserve`; access is granted with
//! one `cuMemSetAccess` per range, for one GPU or several. Reservations are in the process's
//! unified address space, so a chunk on a neighbour mapped here is reached over NVLink by
//! every GPU given access, and `cuMemcpyDtoDAsync` copies between any two such ranges. The driver
//! documents that `cuMemUnmap` must cover "the entire contiguous address range that was mapped",
//! so `unmap` unmaps one chunk mapping per call, as PyTorch's expandable segments do. (On the
//! H200 with driver 580 one call over several mappings also returns success — but so does a
//! call over a range that was never mapped, so success proves nothing, and a property test
//! lost data that way; one call per chunk measured the same total cost.) Beware that `cuMemSetAccess` over a range with an unmapped hole inside
//! returns success there yet grants nothing past the hole: callers must only pass fully mapped
//! ranges, as the trait requires. Every driver error names the call that failed;
//! `CUDA_ERROR_OUT_OF_MEMORY` from device allocations becomes [`DeviceError::OutOfMemory`].
//! Allocations shared with other processes as POSIX file descriptors: see `sharing`.

mod driver;
mod kernels;
mod locations;
pub mod nvml;
mod ops;
mod pinned;
mod sharing;

pub use pinned::pinned_memory_way;
#[cfg(test)]
mod tests;

use std::ffi::{c_char, CStr};
use std::ptr;

use cudarc::driver::sys::{self, CUresult};

use crate::{BackendKind, DeviceError, DeviceInfo, DevicePtr, EventHandle, Result, StreamHandle};
use driver::{check, ElapsedFn, NO_DRIVER_HINT};

/// One GPU, driven through the CUDA driver API. See the module documentation.
pub struct CudaDevice {
    /// The retained primary context; released in `Drop`.
    ctx: sys::CUcontext,
    dev: sys::CUdevice,
    /// Allocation properties of chunks in this GPU's HBM: pinned device memory on `dev`.
    prop: sys::CUmemAllocationProp,
    /// Allocation properties of chunks in host memory, or why there are none (`locations`).
    host_prop: std::result::Result<sys::CUmemAllocationProp, String>,
    /// The driver's handle of every GPU, by ordinal (this one's is `dev`).
    devices: Vec<sys::CUdevice>,
    granularity: usize,
    /// `cuCtxGetStreamPriorityRange`: numerically, greatest <= least.
    least_priority: i32,
    greatest_priority: i32,
    /// `cuEventElapsedTime_v2` or, on older drivers, `cuEventElapsedTime`.
    elapsed: Option<(&'static str, ElapsedFn)>,
    info: DeviceInfo,
    /// The pattern kernels, loaded at their first launch.
    kernels: std::sync::OnceLock<kernels::Kernels>,
    /// Pinned host memory given out, and how each was made (pinned.rs).
    pinned: pinned::PinnedAllocations,
}

// SAFETY: the fields are plain integers and immutable driver handles. The driver API
// is thread-safe: contexts, streams, events and allocations may be used from any thread, and
// every method first makes this device's context current on the calling thread (`bind`).
unsafe impl Send for CudaDevice {}
// SAFETY: see `Send`; no method mutates `CudaDevice`.
unsafe impl Sync for CudaDevice {}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice").field("info", &self.info).finish_non_exhaustive()
    }
}

/// Restores the context that was current on this thread before [`CudaDevice::bind`], if it was
/// another one (a thread with no context keeps ours: the cheap case for tiermem's own threads).
struct CtxGuard {
    restore: Option<sys::CUcontext>,
}

impl Drop for CtxGuard {
    fn drop(&mut self) {
        if let Some(prev) = self.restore {
            // SAFETY: `prev` was current on this thread a moment ago; if its owner destroyed it
            // meanwhile the driver returns an error, which there is no one to report to.
            let _ = unsafe { sys::cuCtxSetCurrent(prev) };
        }
    }
}

fn stream_ptr(s: StreamHandle) -> sys::CUstream {
    s.0 as usize as sys::CUstream
}

fn event_ptr(e: EventHandle) -> sys::CUevent {
    e.0 as usize as sys::CUevent
}

impl CudaDevice {
    /// Opens GPU `ordinal`. Errors: [`DeviceError::NoDriver`] when `libcuda` cannot be loaded
    /// or used, [`DeviceError::NoDevice`] when the driver sees no such GPU,
    /// [`DeviceError::Unsupported`] when the GPU or driver lacks what tiermem needs. Never panics.
    pub fn open(ordinal: usize) -> Result<CudaDevice> {
        // SAFETY: only tries to dlopen the candidate library names and closes them again.
        if !unsafe { sys::is_culib_present() } {
            return Err(DeviceError::NoDriver(NO_DRIVER_HINT.to_string()));
        }
        // cudarc panics when a symbol cannot be resolved; `open_inner` checks them all first,
        // but a driver that misbehaves otherwise must still not take the host program down.
        std::panic::catch_unwind(move || Self::open_inner(ordinal)).unwrap_or_else(|payload| {
            Err(DeviceError::NoDriver(format!(
                "the CUDA driver library could not be used ({}); set TIERMEM_BACKEND=sim to use \
                 the simulated device",
                driver::panic_message(payload.as_ref())
            )))
        })
    }

    fn open_inner(ordinal: usize) -> Result<CudaDevice> {
        let missing = driver::missing_symbols();
        if !missing.is_empty() {
            return Err(DeviceError::Unsupported(format!(
                "the loaded libcuda lacks {}; tiermem needs a driver for CUDA 12 or newer",
                missing.join(", ")
            )));
        }

        // SAFETY: cuInit takes flags, which must be 0; it may be called any number of times.
        match unsafe { sys::cuInit(0) } {
            CUresult::CUDA_ERROR_NO_DEVICE => {
                return Err(DeviceError::NoDevice(
                    "cuInit: the driver found no CUDA-capable GPU (CUDA_ERROR_NO_DEVICE); set \
                     TIERMEM_BACKEND=sim to use the simulated device"
                        .to_string(),
                ))
            }
            r => check("cuInit", r, || "flags=0".to_string())?,
        }

        let mut count = 0;
        // SAFETY: valid out-pointer; the driver is initialised.
        let r = unsafe { sys::cuDeviceGetCount(&mut count) };
        check("cuDeviceGetCount", r, String::new)?;
        let count = usize::try_from(count).unwrap_or(0);
        if ordinal >= count {
            return Err(DeviceError::NoDevice(format!("GPU {ordinal} requested, but the driver sees {count} GPU(s)")));
        }
        let mut dev: sys::CUdevice = 0;
        // SAFETY: valid out-pointer; `ordinal < count <= i32::MAX`, so the cast is exact.
        let r = unsafe { sys::cuDeviceGet(&mut dev, ordinal as i32) };
        check("cuDeviceGet", r, || format!("ordinal={ordinal}"))?;

        let mut name_buf = [0 as c_char; 256];
        // SAFETY: the buffer holds `len` bytes; the driver writes a NUL-terminated name into it.
        let r = unsafe { sys::cuDeviceGetName(name_buf.as_mut_ptr(), 256, dev) };
        check("cuDeviceGetName", r, || format!("ordinal={ordinal}"))?;
        // SAFETY: the buffer is zero-initialised and the driver NUL-terminates what it writes,
        // so there is a NUL within the buffer.
        let name = unsafe { CStr::from_ptr(name_buf.as_ptr()) }.to_string_lossy().into_owned();

        let mut vmm = 0;
        let attr = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED;
        // SAFETY: valid out-pointer and device.
        let r = unsafe { sys::cuDeviceGetAttribute(&mut vmm, attr, dev) };
        check("cuDeviceGetAttribute", r, || {
            format!("ordinal={ordinal} attribute=VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED")
        })?;
        if vmm == 0 {
            return Err(DeviceError::Unsupported(format!(
                "GPU {ordinal} ({name}) does not support the CUDA virtual memory management API \
                 (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 0)"
            )));
        }

        let mut ctx: sys::CUcontext = ptr::null_mut();
        // SAFETY: valid out-pointer and device; balanced by cuDevicePrimaryCtxRelease in Drop.
        let r = unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) };
        check("cuDevicePrimaryCtxRetain", r, || format!("ordinal={ordinal}"))?;

        // From here on `Drop` releases the context if a later step fails.
        let mut this = CudaDevice {
            ctx,
            dev,
            prop: locations::allocation_prop(locations::device_location(dev)),
            host_prop: Err("not probed".to_string()),
            devices: Vec::new(),
            granularity: 0,
            least_priority: 0,
            greatest_priority: 0,
            elapsed: driver::resolve_elapsed(),
            info: DeviceInfo {
                backend: BackendKind::Cuda,
                ordinal,
                name,
                device_count: count,
                driver_version: String::new(),
                cuda_version: String::new(),
                total_bytes: 0,
                granularity: 0,
                vmm_supported: true,
                peers: Vec::new(),
                uuid: None,
            },
            kernels: std::sync::OnceLock::new(),
            pinned: pinned::PinnedAllocations::default(),
        };
        this.probe()?;
        Ok(this)
    }

    /// Fills the fields of `open` that need the context.
    fn probe(&mut self) -> Result<()> {
        let _ctx = self.bind()?;
        let ordinal = self.info.ordinal;
        let at = || format!("ordinal={ordinal}");

        let mut granularity = 0usize;
        let minimum = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
        // SAFETY: valid out-pointer; `prop` is a fully initialised allocation description.
        let r = unsafe { sys::cuMemGetAllocationGranularity(&mut granularity, &self.prop, minimum) };
        check("cuMemGetAllocationGranularity", r, at)?;
        if granularity == 0 {
            return Err(DeviceError::Unsupported(format!("GPU {ordinal}: cuMemGetAllocationGranularity reported 0")));
        }

        let (mut least, mut greatest) = (0, 0);
        // SAFETY: valid out-pointers; our context is current.
        let r = unsafe { sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest) };
        check("cuCtxGetStreamPriorityRange", r, at)?;

        let mut total = 0usize;
        // SAFETY: valid out-pointer and device.
        let r = unsafe { sys::cuDeviceTotalMem_v2(&mut total, self.dev) };
        check("cuDeviceTotalMem_v2", r, at)?;

        let mut version = 0;
        // SAFETY: valid out-pointer.
        let r = unsafe { sys::cuDriverGetVersion(&mut version) };
        check("cuDriverGetVersion", r, String::new)?;
        let cuda_version = driver::format_cuda_version(version);

        let mut devices = Vec::with_capacity(self.info.device_count);
        for j in 0..self.info.device_count {
            let mut device: sys::CUdevice = 0;
            // SAFETY: valid out-pointer; `j < device_count`, which fits in i32.
            let r = unsafe { sys::cuDeviceGet(&mut device, j as i32) };
            check("cuDeviceGet", r, || format!("ordinal={j}"))?;
            devices.push(device);
        }
        let mut peers = Vec::new();
        for (j, &peer) in devices.iter().enumerate().filter(|&(j, _)| j != ordinal) {
            let mut can = 0;
            // SAFETY: valid out-pointer and devices.
            let r = unsafe { sys::cuDeviceCanAccessPeer(&mut can, self.dev, peer) };
            check("cuDeviceCanAccessPeer", r, || format!("ordinal={ordinal} peer={j}"))?;
            if can != 0 {
                peers.push(j);
            }
        }

        self.host_prop = locations::probe_host(self.dev, granularity);
        self.devices = devices;
        self.granularity = granularity;
        self.least_priority = least;
        self.greatest_priority = greatest;
        self.info.granularity = granularity;
        self.info.total_bytes = total;
        self.info.driver_version = driver::nvml_driver_version(&cuda_version);
        self.info.cuda_version = cuda_version;
        self.info.peers = peers;
        self.info.uuid = nvml::uuid_of(self.dev);
        Ok(())
    }

    /// Makes this device's context current on the calling thread until the guard drops.
    fn bind(&self) -> Result<CtxGuard> {
        let mut cur: sys::CUcontext = ptr::null_mut();
        // SAFETY: valid out-pointer; reads the calling thread's current context.
        let r = unsafe { sys::cuCtxGetCurrent(&mut cur) };
        check("cuCtxGetCurrent", r, String::new)?;
        if cur == self.ctx {
            return Ok(CtxGuard { restore: None });
        }
        // SAFETY: `self.ctx` is the primary context retained in `open` and released only in Drop.
        let r = unsafe { sys::cuCtxSetCurrent(self.ctx) };
        check("cuCtxSetCurrent", r, || format!("GPU {}", self.info.ordinal))?;
        Ok(CtxGuard { restore: (!cur.is_null()).then_some(cur) })
    }

    pub(super) fn unmap_granules(&self, va: DevicePtr, size: usize) -> Result<()> {
        let g = self.granularity;
        for off in (0..size).step_by(g) {
            let at = va + off as u64;
            // SAFETY: unmapping device VA only affects device page tables; the driver validates
            // that `at` is the start of a mapping of exactly one granule.
            let r = unsafe { sys::cuMemUnmap(at, g) };
            check("cuMemUnmap", r, || {
                format!("va=0x{at:x} size={g} (granule {} of range va=0x{va:x} size={size})", off / g)
            })?;
        }
        Ok(())
    }
}

impl CudaDevice {
    /// The pattern kernels, loading them in this device's context at first use.
    fn kernels(&self) -> Result<&kernels::Kernels> {
        if let Some(k) = self.kernels.get() {
            return Ok(k);
        }
        let _ctx = self.bind()?;
        let loaded = kernels::Kernels::load()?;
        // Two threads may load at once: the loser's module is unloaded here, in our context.
        let _ = self.kernels.set(loaded);
        Ok(self.kernels.get().expect("set above"))
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        if let Some(kernels) = self.kernels.take() {
            let _ctx = self.bind();
            drop(kernels); // unloads the module while the context still exists
        }
        // SAFETY: balances the cuDevicePrimaryCtxRetain of `open`; no context needs to be
        // current. Nothing can be reported from Drop, so the result is ignored.
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
    }
}
