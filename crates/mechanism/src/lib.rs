//! The mechanism layer of tiermem: everything that touches a device, and nothing that decides.
//!
//! A [`Device`] offers exactly the operations the engine needs to keep buffers at stable
//! virtual addresses while their 2 MiB chunks move between HBM and pinned host memory:
//! reserve a VA range, create and map physical chunks, set access once per range, copy
//! asynchronously on streams, and order work with events. A device is one GPU among several:
//! chunks have a [`ChunkLocation`] (any GPU's HBM, or host memory), access can be given to
//! several GPUs, and copies run between any two devices' memory. Two backends implement it:
//!
//! * [`cuda::CudaDevice`] — the CUDA driver API through `cudarc` with dynamic loading, so
//!   builds need no CUDA and a machine without a driver gets a clear error at run time;
//! * [`sim::SimDevice`] — a test double for CI: host memory stands in for HBM, with the same
//!   chunk and VA semantics (an unmapped chunk cannot be touched; access is per range and per
//!   GPU), for one GPU or a node of several (`SimDevice::node`).
//!
//! Which one to use is the caller's choice ([`open`] implements `TIERMEM_BACKEND`).
//! Adaptors wrap a device and add one concern each: [`counting::CountingDevice`] counts what
//! is held (leak checks), [`timing::TimedDevice`] adds up the time spent in driver calls,
//! [`chunked::ChunkedDevice`] makes chunks of several granules.

pub mod chunked;
pub mod counting;
pub mod cuda;
mod device;
mod error;
pub mod faults;
pub mod file_store;
mod forward;
mod host_memory;
pub mod pattern;
pub mod sim;
pub mod timing;

pub use device::{
    BackendKind, ChunkLocation, Device, DeviceInfo, DevicePtr, EventHandle, GpuMemory, HostPtr, PhysHandle,
    StreamHandle, StreamPriority,
};
pub use error::{DeviceError, Result};
pub use host_memory::HostMemory;

use std::sync::Arc;

/// Which backend `open` should use: `auto` picks CUDA when a driver and a GPU are present.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    Auto,
    Cuda,
    Sim,
}

impl std::str::FromStr for BackendChoice {
    type Err = DeviceError;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(Self::Auto),
            "cuda" => Ok(Self::Cuda),
            "sim" => Ok(Self::Sim),
            other => Err(DeviceError::Config(format!("TIERMEM_BACKEND={other:?}: expected auto, cuda or sim"))),
        }
    }
}

/// Opens device `ordinal` with the chosen backend. `Auto` falls back to the simulated device
/// only when no CUDA driver or no GPU is found; the returned `Option<String>` then says why.
pub fn open(choice: BackendChoice, ordinal: usize, sim_hbm_bytes: usize) -> Result<(Arc<dyn Device>, Option<String>)> {
    open_in_node(choice, ordinal, SimNode { gpus: 1, hbm_per_gpu: sim_hbm_bytes })
}

/// The simulated node `open_in_node` makes when it falls back to the simulated device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimNode {
    pub gpus: usize,
    pub hbm_per_gpu: usize,
}

/// As [`open`], but a simulated device is GPU `ordinal` of a node of `sim.gpus` GPUs with
/// peer access to each other (a node of one GPU is that GPU, whatever `ordinal`).
pub fn open_in_node(choice: BackendChoice, ordinal: usize, sim: SimNode) -> Result<(Arc<dyn Device>, Option<String>)> {
    let simulated = || -> Result<Arc<dyn Device>> {
        let mut node = sim::SimDevice::node(sim.gpus, sim.hbm_per_gpu)?;
        let index = if sim.gpus == 1 { 0 } else { ordinal };
        if index >= node.len() {
            return Err(DeviceError::NoDevice(format!(
                "GPU {ordinal} requested of a simulated node of {} GPU(s)",
                sim.gpus
            )));
        }
        Ok(Arc::new(node.swap_remove(index)))
    };
    match choice {
        BackendChoice::Cuda => Ok((Arc::new(cuda::CudaDevice::open(ordinal)?), None)),
        BackendChoice::Sim => Ok((simulated()?, None)),
        BackendChoice::Auto => match cuda::CudaDevice::open(ordinal) {
            Ok(dev) => Ok((Arc::new(dev), None)),
            Err(why @ (DeviceError::NoDriver(_) | DeviceError::NoDevice(_))) => {
                Ok((simulated()?, Some(why.to_string())))
            }
            Err(other) => Err(other),
        },
    }
}
