//! The driver and NVML entry points over one fake GPU and over two, called as a program calls
//! them. They share the fake's state, so each test installs its own and holds `SERIAL`.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::Mutex;

use crate::nvml::*;
use crate::*;

static SERIAL: Mutex<()> = Mutex::new(());
const G: usize = GRANULARITY;

/// Replaces the fake's state by `gpus` GPUs of 8 granules each, with GPU 0's context current.
fn install(gpus: usize) -> std::sync::MutexGuard<'static, ()> {
    let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let fake = Fake { memory: Memory::new(8 * G, gpus), settings: Settings { host_chunks: true } };
    *FAKE.lock().unwrap_or_else(|p| p.into_inner()) = Some(fake);
    assert_eq!(cuCtxSetCurrent(PRIMARY as *mut c_void), CUDA_SUCCESS);
    serial
}

fn prop(device: c_int) -> AllocationProp {
    AllocationProp {
        kind: 1,
        handle_types: 0,
        location: Location { kind: 1, id: device },
        win32_metadata: std::ptr::null_mut(),
        compression: 0,
        gpu_direct_rdma: 0,
    }
}

/// `cuMemCreate` of one granule on GPU `device`.
fn create(device: c_int) -> Result<u64, Code> {
    let mut handle = 0;
    // SAFETY: a valid out-pointer and allocation description.
    match unsafe { cuMemCreate(&mut handle, G, &prop(device), 0) } {
        CUDA_SUCCESS => Ok(handle),
        code => Err(code),
    }
}

fn census() -> Census {
    let mut census = Census::default();
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { tiermem_fake_census(&mut census) }, CUDA_SUCCESS);
    census
}

fn count() -> c_int {
    let mut count = 0;
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { cuDeviceGetCount(&mut count) }, CUDA_SUCCESS);
    count
}

fn can_access(device: c_int, peer: c_int) -> c_int {
    let mut can = -1;
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { cuDeviceCanAccessPeer(&mut can, device, peer) }, CUDA_SUCCESS);
    can
}

fn bus_id(device: c_int) -> Result<String, Code> {
    let mut text = [0 as c_char; 32];
    // SAFETY: a buffer of 32 characters.
    match unsafe { cuDeviceGetPCIBusId(text.as_mut_ptr(), 32, device) } {
        // SAFETY: the fake wrote a NUL-terminated string.
        CUDA_SUCCESS => Ok(unsafe { CStr::from_ptr(text.as_ptr()) }.to_string_lossy().into_owned()),
        code => Err(code),
    }
}

/// NVML's handle of the GPU at PCI address `text`, or its error.
fn nvml_at(text: &CStr) -> Result<*mut c_void, c_int> {
    let mut device = std::ptr::null_mut();
    // SAFETY: a NUL-terminated string and a valid out-pointer.
    match unsafe { nvmlDeviceGetHandleByPciBusId_v2(text.as_ptr(), &mut device) } {
        0 => Ok(device),
        code => Err(code),
    }
}

/// NVML's `(total, free, used)` of `device`.
fn nvml_memory(device: *mut c_void) -> [u64; 3] {
    let mut memory = [0u64; 3];
    // SAFETY: a valid nvmlMemory_t.
    assert_eq!(unsafe { nvmlDeviceGetMemoryInfo(device, &mut memory) }, 0);
    memory
}

#[test]
fn one_gpu_has_no_peer() {
    let _serial = install(1);
    assert_eq!(count(), 1);
    let mut device = -1;
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { cuDeviceGet(&mut device, 1) }, CUDA_ERROR_INVALID_DEVICE);
    assert_eq!(can_access(0, 1), 0);
    assert_eq!(bus_id(0).as_deref(), Ok("0000:01:00.0"));
    assert_eq!(bus_id(1), Err(CUDA_ERROR_INVALID_DEVICE));
    assert_eq!(create(1), Err(CUDA_ERROR_INVALID_DEVICE));
    assert_eq!(nvml_at(c"00000000:02:00.0"), Err(6));
    assert!(nvml_at(c"00000000:01:00.0").is_ok());
}

#[test]
fn a_second_gpu_is_a_peer_with_memory_of_its_own() {
    let _serial = install(2);
    assert_eq!(count(), 2);
    let mut device = -1;
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(cuDeviceGet(&mut device, 1), CUDA_SUCCESS);
        assert_eq!(cuDeviceGet(&mut device, 2), CUDA_ERROR_INVALID_DEVICE);
    }
    assert_eq!((can_access(0, 1), can_access(1, 0), can_access(1, 1), can_access(0, 2)), (1, 1, 0, 0));
    assert_eq!(bus_id(1).as_deref(), Ok("0000:02:00.0"));
    assert_eq!(bus_id(2), Err(CUDA_ERROR_INVALID_DEVICE));
    let mut total = 0;
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { cuDeviceTotalMem_v2(&mut total, 1) }, CUDA_SUCCESS);
    assert_eq!(total, 8 * G);

    let near = create(0).unwrap();
    let far = create(1).unwrap();
    assert_eq!(create(2), Err(CUDA_ERROR_INVALID_DEVICE));
    let c = census();
    assert_eq!((c.gpu_chunks, c.used_bytes, c.neighbour_chunks, c.neighbour_used_bytes), (1, G, 1, G));

    let mut va = 0;
    // SAFETY: valid out-pointers and buffers; access descriptors of GPUs 0 and 1.
    unsafe {
        assert_eq!(cuMemAddressReserve(&mut va, 2 * G, 0, 0, 0), CUDA_SUCCESS);
        assert_eq!(cuMemMap(va, G, 0, near, 0), CUDA_SUCCESS);
        assert_eq!(cuMemMap(va + G as u64, G, 0, far, 0), CUDA_SUCCESS);
        let descs: [c_int; 6] = [1, 0, 3, 1, 1, 3];
        assert_eq!(cuMemSetAccess(va, 2 * G, descs.as_ptr().cast(), 2), CUDA_SUCCESS);
        assert_eq!(cuMemsetD8_v2(va + G as u64, 7, G), CUDA_SUCCESS);
        let mut byte = 0u8;
        assert_eq!(cuMemcpyDtoH_v2((&raw mut byte).cast(), va + 2 * G as u64 - 1, 1), CUDA_SUCCESS);
        assert_eq!(byte, 7);
    }
    assert_eq!((tiermem_fake_location(va), tiermem_fake_location(va + G as u64)), (1, 3));

    let gpu1 = nvml_at(c"0000:02:00.0").unwrap();
    assert_eq!(nvml_at(c"00000000:02:00.0"), Ok(gpu1));
    assert_ne!(nvml_at(c"0000:01:00.0"), Ok(gpu1));
    assert_eq!(nvml_at(c"0000:03:00.0"), Err(6));
    assert_eq!(nvml_memory(gpu1), [8 * G as u64, 7 * G as u64, G as u64]);
    let mut gpus: c_uint = 0;
    let mut processes: c_uint = 9;
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(nvmlDeviceGetCount_v2(&mut gpus), 0);
        assert_eq!(nvmlDeviceGetComputeRunningProcesses_v3(gpu1, &mut processes, std::ptr::null_mut()), 0);
    }
    assert_eq!((gpus, processes), (2, 0));
    assert_eq!(nvmlDeviceGetProcessUtilization(gpu1, std::ptr::null_mut(), &mut processes, 0), 6);

    assert_eq!(cuMemUnmap(va, 2 * G), CUDA_SUCCESS);
    assert_eq!(cuMemRelease(far), CUDA_SUCCESS);
    assert_eq!(cuMemRelease(near), CUDA_SUCCESS);
    assert_eq!(cuMemAddressFree(va, 2 * G), CUDA_SUCCESS);
    let c = census();
    assert_eq!((c.gpu_chunks, c.neighbour_chunks, c.neighbour_used_bytes), (0, 0, 0));
}

#[test]
fn gpu_1s_context_answers_for_gpu_1() {
    let _serial = install(2);
    let mut ctx = std::ptr::null_mut();
    let (mut device, mut free, mut total, mut plain) = (-1, 0, 0, 0);
    // SAFETY: valid out-pointers; the context the fake handed out.
    unsafe {
        assert_eq!(cuDevicePrimaryCtxRetain(&mut ctx, 1), CUDA_SUCCESS);
        assert_eq!(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
        assert_eq!(cuCtxGetDevice(&mut device), CUDA_SUCCESS);
        assert_eq!(cuMemAlloc_v2(&mut plain, G), CUDA_SUCCESS);
        assert_eq!(cuMemGetInfo_v2(&mut free, &mut total), CUDA_SUCCESS);
    }
    assert_eq!((device, free, total), (1, 7 * G, 8 * G));
    assert_eq!(census().used_bytes, 0, "not GPU 0's memory");
    assert_eq!(cuMemFree_v2(plain), CUDA_SUCCESS);
    assert_eq!(cuCtxSetCurrent(PRIMARY as *mut c_void), CUDA_SUCCESS);
    assert_eq!(cuDevicePrimaryCtxRelease_v2(1), CUDA_SUCCESS);
    let c = census();
    assert_eq!((c.plain, c.used_bytes, c.neighbour_used_bytes), (0, 0, 0), "GPU 1 has its memory back");
}

#[test]
fn a_context_of_the_programs_own_is_current_until_destroyed_and_frees_its_memory_then() {
    let _serial = install(2);
    let (mut ctx, mut popped) = (std::ptr::null_mut(), std::ptr::null_mut());
    let (mut device, mut theirs, mut primarys) = (-1, 0, 0);
    // SAFETY: valid out-pointers; the contexts the fake handed out.
    unsafe {
        assert_eq!(cuCtxCreate_v2(&mut ctx, 0, 1), CUDA_SUCCESS);
        assert_eq!(cuCtxGetDevice(&mut device), CUDA_SUCCESS);
        assert_eq!(device, 1, "current on the thread that created it");
        assert_eq!(cuMemAlloc_v2(&mut theirs, G), CUDA_SUCCESS);
        assert_eq!(cuCtxSynchronize(), CUDA_SUCCESS);
        assert_eq!(tiermem_fake_context_syncs(ctx), 1);
        assert_eq!(cuCtxPopCurrent_v2(&mut popped), CUDA_SUCCESS);
        assert_eq!(popped, ctx);
        assert_eq!(cuCtxGetDevice(&mut device), CUDA_SUCCESS);
        assert_eq!(device, 0, "the primary context below it is current again");
        assert_eq!(cuMemAlloc_v2(&mut primarys, G), CUDA_SUCCESS);
        assert_eq!(cuCtxPushCurrent_v2(ctx), CUDA_SUCCESS);
    }
    assert_eq!(census().plain, 2);
    assert_eq!(cuCtxDestroy_v2(ctx), CUDA_SUCCESS);
    assert_eq!(census().plain, 1, "the destroyed context's allocation is freed, the primary's stays");
    assert_eq!(cuMemFree_v2(theirs), CUDA_ERROR_INVALID_VALUE, "freed with its context");
    assert_eq!(cuCtxDestroy_v2(ctx), CUDA_ERROR_INVALID_CONTEXT, "a context destroyed already");
    assert_eq!(tiermem_fake_context_syncs(ctx), -1);
    assert_eq!(cuCtxSetCurrent(ctx), CUDA_ERROR_INVALID_CONTEXT);
    let mut now = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { cuCtxGetCurrent(&mut now) }, CUDA_SUCCESS);
    assert_eq!(now as usize, PRIMARY, "destroying the current context pops it");
    assert_eq!(cuMemFree_v2(primarys), CUDA_SUCCESS);
}
