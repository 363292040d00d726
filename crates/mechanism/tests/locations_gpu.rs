//! Chunk locations on the GPU: the scenarios of locations_common on `CudaDevice` — chunks at
//! this GPU's own location copied between, a chunk in host memory (`CU_MEM_LOCATION_TYPE_HOST_NUMA`)
//! mapped and touched by the GPU, and, with two GPUs with peer access, a chunk on GPU 1 mapped
//! at GPU 0's address. Without a GPU each test says why it skipped, unless
//! `TIERMEM_TEST_BACKEND=cuda` insists on one.

mod locations_common;

use locations_common::{copies_between_own_chunks, host_chunk_is_addressable, peer_chunk_mapped_here};
use tiermem_mechanism::cuda::CudaDevice;
use tiermem_mechanism::{Device, DeviceError};

/// GPU `ordinal`, or `None` (after saying why) where there is none and none is insisted on.
fn gpu(ordinal: usize) -> Option<CudaDevice> {
    match CudaDevice::open(ordinal) {
        Ok(dev) => Some(dev),
        Err(DeviceError::NoDriver(why) | DeviceError::NoDevice(why)) => {
            let insisted = std::env::var("TIERMEM_TEST_BACKEND").as_deref() == Ok("cuda");
            assert!(!insisted || ordinal > 0, "TIERMEM_TEST_BACKEND=cuda, but no GPU: {why}");
            eprintln!("skipped: {why}");
            None
        }
        Err(other) => panic!("CudaDevice::open({ordinal}): {other}"),
    }
}

#[test]
fn gpu_copies_between_chunks_at_its_own_location() {
    let Some(dev) = gpu(0) else { return };
    copies_between_own_chunks(&dev);
}

#[test]
fn gpu_host_chunks_are_mapped_and_addressable() {
    let Some(dev) = gpu(0) else { return };
    if let Err(why) = host_chunk_is_addressable(&dev) {
        eprintln!("skipped: this driver cannot create chunks in host memory: {why}");
    }
}

#[test]
fn gpu_a_chunk_on_gpu_1_is_mapped_at_gpu_0s_address() {
    let Some(zero) = gpu(0) else { return };
    if zero.info().device_count < 2 {
        eprintln!("skipped: one GPU ({}), two are needed", zero.info().name);
        return;
    }
    let Some(one) = gpu(1) else { return };
    if !(zero.peer_access(1) && one.peer_access(0)) {
        eprintln!("skipped: GPUs 0 and 1 have no peer access to each other (peers {:?})", zero.info().peers);
        return;
    }
    peer_chunk_mapped_here(&zero, &one);
    peer_chunk_mapped_here(&one, &zero);
}
