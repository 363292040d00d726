//! What the machine knows of any GPU's memory, through NVML: free and total bytes, the
//! processes using it and what each holds ([`census`]: the node daemon's accounting), and how
//! busy its kernels keep it.
//!
//! "How busy" is the SMs' share of time, from NVML's per-process samples of the last second,
//! summed over processes: NVML's device-wide `utilization.gpu` also counts a GPU whose copy
//! engines alone work (measured on the H100 pair: a borrower's page-ins copied by the lender's
//! engine made the idle lender look busy), and a borrower must not take its own copies for the
//! lender's work. Where per-process samples are not supported, `utilization.gpu` it is. The driver API can only say this for a GPU whose context is current,
//! and making a context on a neighbour costs hundreds of MiB of its memory, so a lender's
//! memory is read from NVML instead, matched to the CUDA device by its PCI bus id (CUDA and
//! NVML may number GPUs differently).

use std::ffi::{c_char, CStr};
use std::sync::OnceLock;

use cudarc::driver::sys;
use nvml_wrapper::Nvml;

use super::driver::check;
use crate::{DeviceError, GpuMemory, Result};

/// NVML, initialised once per process, or why it could not be.
fn nvml() -> std::result::Result<&'static Nvml, String> {
    static NVML: OnceLock<std::result::Result<Nvml, String>> = OnceLock::new();
    NVML.get_or_init(|| Nvml::init().map_err(|e| e.to_string())).as_ref().map_err(Clone::clone)
}

/// The PCI bus id of `dev` ("0000:18:00.0").
fn pci_bus_id(dev: sys::CUdevice) -> Result<String> {
    let mut buf = [0 as c_char; 64];
    // SAFETY: the buffer holds 64 bytes; the driver writes a NUL-terminated id into it.
    let r = unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev) };
    check("cuDeviceGetPCIBusId", r, || format!("device {dev}"))?;
    // SAFETY: zero-initialised buffer, NUL-terminated by the driver within it.
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
}

/// Percent of the last second in which kernels of any process ran on `device`'s SMs (at most
/// 100); `None` if NVML cannot say.
fn kernels_busy(device: &nvml_wrapper::Device) -> Option<u32> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?;
    let since = (now.as_micros() as u64).saturating_sub(1_000_000);
    match device.process_utilization_stats(since) {
        Ok(samples) => {
            let mut by_process = std::collections::HashMap::new();
            for sample in samples.iter().filter(|s| s.timestamp >= since) {
                let most = by_process.entry(sample.pid).or_insert(0u32);
                *most = (*most).max(sample.sm_util);
            }
            Some(by_process.values().sum::<u32>().min(100))
        }
        // No process had a sample in that second.
        Err(nvml_wrapper::error::NvmlError::NotFound) => Some(0),
        Err(_) => device.utilization_rates().ok().map(|u| u.gpu),
    }
}

/// The memory of GPU `dev` (CUDA ordinal `ordinal`) as NVML reports it now.
pub(super) fn gpu_memory(ordinal: usize, dev: sys::CUdevice) -> Result<GpuMemory> {
    let unsupported = |why: String| DeviceError::Unsupported(format!("the memory of GPU {ordinal}: {why}"));
    let nvml = nvml().map_err(|e| unsupported(format!("NVML is not available ({e})")))?;
    let bus = pci_bus_id(dev)?;
    let device = nvml.device_by_pci_bus_id(bus.as_str()).map_err(|e| unsupported(format!("NVML, bus {bus}: {e}")))?;
    let memory = device.memory_info().map_err(|e| unsupported(format!("nvmlDeviceGetMemoryInfo: {e}")))?;
    let me = std::process::id();
    let others = |list: std::result::Result<Vec<nvml_wrapper::struct_wrappers::device::ProcessInfo>, _>| {
        list.ok().map(|procs| procs.iter().filter(|p| p.pid != me).count())
    };
    let compute = others(device.running_compute_processes());
    let graphics = others(device.running_graphics_processes());
    let other_processes = compute.zip(graphics).map(|(c, g)| c + g);
    let busy_percent = kernels_busy(&device);
    Ok(GpuMemory { free: memory.free as usize, total: memory.total as usize, other_processes, busy_percent })
}

/// The NVML UUID of CUDA device `dev` ("GPU-…"), if NVML can say.
pub(super) fn uuid_of(dev: sys::CUdevice) -> Option<String> {
    let bus = pci_bus_id(dev).ok()?;
    nvml().ok()?.device_by_pci_bus_id(bus.as_str()).ok()?.uuid().ok()
}

/// One GPU's memory as the driver accounts for it: its size, what is in use, and what each
/// process using it holds (process ids as the machine's NVML sees them: those of the host's
/// pid namespace). Processes whose use NVML does not report are listed with `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Census {
    pub total: u64,
    pub used: u64,
    pub processes: Vec<(u32, Option<u64>)>,
}

/// The [`Census`] of the GPU whose UUID is `uuid`. Needs NVML only: no CUDA context is made
/// (a context would itself take hundreds of MiB of the GPU it counts).
pub fn census(uuid: &str) -> std::result::Result<Census, String> {
    use nvml_wrapper::enums::device::UsedGpuMemory;
    let nvml = nvml().map_err(|e| format!("NVML is not available ({e})"))?;
    let device = nvml.device_by_uuid(uuid).map_err(|e| format!("NVML, GPU {uuid}: {e}"))?;
    let memory = device.memory_info().map_err(|e| format!("nvmlDeviceGetMemoryInfo, GPU {uuid}: {e}"))?;
    let mut processes = Vec::new();
    for list in [device.running_compute_processes(), device.running_graphics_processes()] {
        let list = list.map_err(|e| format!("NVML's process list of GPU {uuid}: {e}"))?;
        for p in list {
            let bytes = match p.used_gpu_memory {
                UsedGpuMemory::Used(bytes) => Some(bytes),
                UsedGpuMemory::Unavailable => None,
            };
            // A process both computing and drawing is listed twice, with the same use.
            if !processes.iter().any(|&(pid, _)| pid == p.pid) {
                processes.push((p.pid, bytes));
            }
        }
    }
    Ok(Census { total: memory.total, used: memory.used, processes })
}
