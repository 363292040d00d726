//! The [`Device`] operations of [`CudaDevice`]: each binds the context, makes one driver call
//! (two for `write`) and maps its result through `check`.

use std::ffi::c_void;
use std::ptr;

use cudarc::driver::sys::{self, CUresult};

use super::driver::check;
use super::pinned::Pace;
use super::{event_ptr, stream_ptr, CudaDevice};
use crate::{
    ChunkLocation, Device, DeviceError, DeviceInfo, DevicePtr, EventHandle, GpuMemory, HostPtr, PhysHandle, Result,
    StreamHandle, StreamPriority,
};

impl Device for CudaDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn mem_info(&self) -> Result<(usize, usize)> {
        let _ctx = self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers; our context is current.
        let r = unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) };
        check("cuMemGetInfo_v2", r, || format!("GPU {}", self.info.ordinal))?;
        Ok((free, total))
    }

    fn neighbour(&self, ordinal: usize) -> Result<std::sync::Arc<dyn crate::Device>> {
        Ok(std::sync::Arc::new(CudaDevice::open(ordinal)?))
    }

    fn gpu_memory(&self, ordinal: usize) -> Result<GpuMemory> {
        let Some(&dev) = self.devices.get(ordinal) else {
            return Err(DeviceError::NoDevice(format!("GPU {ordinal}: the driver sees {} GPU(s)", self.devices.len())));
        };
        super::nvml::gpu_memory(ordinal, dev)
    }

    fn reserve(&self, size: usize) -> Result<DevicePtr> {
        let _ctx = self.bind()?;
        let mut va: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; address hint 0 and flags 0 let the driver choose.
        let r = unsafe { sys::cuMemAddressReserve(&mut va, size, self.granularity, 0, 0) };
        check("cuMemAddressReserve", r, || format!("size={size} alignment={}", self.granularity))?;
        Ok(va)
    }

    fn unreserve(&self, va: DevicePtr, size: usize) -> Result<()> {
        let _ctx = self.bind()?;
        // SAFETY: frees device VA only; the driver validates that it is a whole reservation.
        let r = unsafe { sys::cuMemAddressFree(va, size) };
        check("cuMemAddressFree", r, || format!("va=0x{va:x} size={size}"))
    }

    fn create_chunk_at(&self, location: ChunkLocation) -> Result<PhysHandle> {
        self.create_chunks_at(location, 1)
    }

    fn create_chunks_at(&self, location: ChunkLocation, granules: usize) -> Result<PhysHandle> {
        let prop = super::locations::chunk_prop(self, location)?;
        self.create_allocation(&prop, location, granules)
    }

    fn create_shareable_chunks_at(&self, location: ChunkLocation, granules: usize) -> Result<PhysHandle> {
        self.create_shareable(location, granules)
    }

    fn export_chunk(&self, chunk: PhysHandle) -> Result<std::os::fd::OwnedFd> {
        self.export(chunk)
    }

    fn import_chunk(&self, fd: std::os::fd::BorrowedFd<'_>, size: usize) -> Result<PhysHandle> {
        self.import(fd, size)
    }

    fn release_chunk(&self, chunk: PhysHandle) -> Result<()> {
        let _ctx = self.bind()?;
        // SAFETY: releases a handle from cuMemCreate; the driver validates it. Backing memory is
        // freed only once no mapping uses it.
        let r = unsafe { sys::cuMemRelease(chunk.0) };
        check("cuMemRelease", r, || format!("handle=0x{:x}", chunk.0))
    }

    fn map(&self, va: DevicePtr, chunk: PhysHandle) -> Result<()> {
        self.map_sized(va, chunk, self.granularity)
    }

    fn map_sized(&self, va: DevicePtr, chunk: PhysHandle, size: usize) -> Result<()> {
        let _ctx = self.bind()?;
        // SAFETY: maps a whole allocation (offset 0, its size, flags 0) into device VA; the
        // driver validates the size, that `va` lies in a reservation and is not mapped yet.
        let r = unsafe { sys::cuMemMap(va, size, 0, chunk.0, 0) };
        check("cuMemMap", r, || format!("va=0x{va:x} size={size} handle=0x{:x}", chunk.0))
    }

    fn set_access_from(&self, va: DevicePtr, size: usize, gpus: &[usize]) -> Result<()> {
        let descs = super::locations::access_descs(self, gpus)?;
        let _ctx = self.bind()?;
        // SAFETY: `descs` holds `descs.len()` initialised descriptors; the driver validates that
        // the range is mapped and that every GPU listed can reach its chunks.
        let r = unsafe { sys::cuMemSetAccess(va, size, descs.as_ptr(), descs.len()) };
        check("cuMemSetAccess", r, || format!("va=0x{va:x} size={size} GPUs {gpus:?} read-write"))
    }

    fn unmap(&self, va: DevicePtr, size: usize) -> Result<()> {
        let _ctx = self.bind()?;
        if size > self.granularity {
            // One call for a range of several whole mappings (a peer tier's slab: ~20 µs per
            // call, so a 64 MiB slab unmaps in one call instead of 32); a driver that refuses
            // a range spanning mappings is asked granule by granule.
            // SAFETY: unmapping device VA only affects device page tables; the driver checks
            // that the range covers whole mappings and unmaps nothing if it does not.
            if unsafe { sys::cuMemUnmap(va, size) } == CUresult::CUDA_SUCCESS {
                return Ok(());
            }
        }
        self.unmap_granules(va, size)
    }

    fn alloc_pinned(&self, size: usize) -> Result<HostPtr> {
        let _ctx = self.bind()?;
        self.pinned.alloc(size, Pace::Fast)
    }

    fn alloc_pinned_gently(&self, size: usize) -> Result<HostPtr> {
        let _ctx = self.bind()?;
        self.pinned.alloc(size, Pace::Gentle)
    }

    fn free_pinned(&self, ptr: HostPtr, size: usize) -> Result<()> {
        let _ctx = self.bind()?;
        self.pinned.free(ptr, size)
    }

    fn create_stream(&self, priority: StreamPriority) -> Result<StreamHandle> {
        let _ctx = self.bind()?;
        let prio = match priority {
            StreamPriority::High => self.greatest_priority,
            StreamPriority::Low => self.least_priority,
        };
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        let mut s: sys::CUstream = ptr::null_mut();
        // SAFETY: valid out-pointer; flags and priority come from the driver's own ranges.
        let r = unsafe { sys::cuStreamCreateWithPriority(&mut s, flags, prio) };
        check("cuStreamCreateWithPriority", r, || format!("flags=NON_BLOCKING priority={prio}"))?;
        Ok(StreamHandle(s as usize as u64))
    }

    fn destroy_stream(&self, stream: StreamHandle) -> Result<()> {
        if stream.0 == 0 {
            return Err(DeviceError::Driver {
                call: "cuStreamDestroy_v2",
                code: "CUDA_ERROR_INVALID_HANDLE".to_string(),
                detail: "the legacy default stream (0) cannot be destroyed".to_string(),
            });
        }
        let _ctx = self.bind()?;
        // SAFETY: a non-null stream handle from `create_stream`; the driver validates it.
        let r = unsafe { sys::cuStreamDestroy_v2(stream_ptr(stream)) };
        check("cuStreamDestroy_v2", r, || format!("stream=0x{:x}", stream.0))
    }

    fn create_event(&self, timing: bool) -> Result<EventHandle> {
        let _ctx = self.bind()?;
        let flags =
            if timing { sys::CUevent_flags::CU_EVENT_DEFAULT } else { sys::CUevent_flags::CU_EVENT_DISABLE_TIMING }
                as u32;
        let mut e: sys::CUevent = ptr::null_mut();
        // SAFETY: valid out-pointer and flags.
        let r = unsafe { sys::cuEventCreate(&mut e, flags) };
        check("cuEventCreate", r, || format!("timing={timing}"))?;
        Ok(EventHandle(e as usize as u64))
    }

    fn destroy_event(&self, event: EventHandle) -> Result<()> {
        let _ctx = self.bind()?;
        // SAFETY: an event handle from `create_event`; the driver validates it.
        let r = unsafe { sys::cuEventDestroy_v2(event_ptr(event)) };
        check("cuEventDestroy_v2", r, || format!("event=0x{:x}", event.0))
    }

    fn record_event(&self, event: EventHandle, stream: StreamHandle) -> Result<()> {
        let _ctx = self.bind()?;
        // SAFETY: handles from this device (stream 0 = legacy default stream); driver-validated.
        let r = unsafe { sys::cuEventRecord(event_ptr(event), stream_ptr(stream)) };
        check("cuEventRecord", r, || format!("event=0x{:x} stream=0x{:x}", event.0, stream.0))
    }

    fn stream_wait_event(&self, stream: StreamHandle, event: EventHandle) -> Result<()> {
        let _ctx = self.bind()?;
        // SAFETY: handles from this device; flags 0 (CU_EVENT_WAIT_DEFAULT).
        let r = unsafe { sys::cuStreamWaitEvent(stream_ptr(stream), event_ptr(event), 0) };
        check("cuStreamWaitEvent", r, || format!("stream=0x{:x} event=0x{:x}", stream.0, event.0))
    }

    fn event_done(&self, event: EventHandle) -> Result<bool> {
        let _ctx = self.bind()?;
        // SAFETY: an event handle from `create_event`; the query never blocks.
        match unsafe { sys::cuEventQuery(event_ptr(event)) } {
            CUresult::CUDA_SUCCESS => Ok(true),
            CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => check("cuEventQuery", r, || format!("event=0x{:x}", event.0)).map(|()| false),
        }
    }

    fn synchronize_event(&self, event: EventHandle) -> Result<()> {
        let _ctx = self.bind()?;
        // SAFETY: an event handle from `create_event`.
        let r = unsafe { sys::cuEventSynchronize(event_ptr(event)) };
        check("cuEventSynchronize", r, || format!("event=0x{:x}", event.0))
    }

    fn synchronize_stream(&self, stream: StreamHandle) -> Result<()> {
        let _ctx = self.bind()?;
        // SAFETY: a stream handle from `create_stream`, or 0 for the legacy default stream.
        let r = unsafe { sys::cuStreamSynchronize(stream_ptr(stream)) };
        check("cuStreamSynchronize", r, || format!("stream=0x{:x}", stream.0))
    }

    fn elapsed_ms(&self, start: EventHandle, end: EventHandle) -> Result<f32> {
        let Some((call, elapsed)) = self.elapsed else {
            return Err(DeviceError::Unsupported(
                "the loaded libcuda exports neither cuEventElapsedTime_v2 nor cuEventElapsedTime".to_string(),
            ));
        };
        let _ctx = self.bind()?;
        let mut ms = 0f32;
        // SAFETY: `elapsed` was resolved from libcuda, which stays loaded, with the C signature
        // of cuEventElapsedTime(_v2); valid out-pointer; event handles are driver-validated.
        let r = unsafe { elapsed(&mut ms, event_ptr(start), event_ptr(end)) };
        check(call, r, || format!("start=0x{:x} end=0x{:x}", start.0, end.0))?;
        Ok(ms)
    }

    unsafe fn copy_to_device_async(
        &self,
        dst: DevicePtr,
        src: HostPtr,
        len: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        let _ctx = self.bind()?;
        // SAFETY: the caller guarantees `src..src+len` is pinned memory that stays valid until
        // the copy completes on `stream`; the device side is validated by the driver.
        let r = unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, len, stream_ptr(stream)) };
        check("cuMemcpyHtoDAsync_v2", r, || format!("dst=0x{dst:x} src=0x{src:x} len={len} stream=0x{:x}", stream.0))
    }

    unsafe fn copy_to_host_async(&self, dst: HostPtr, src: DevicePtr, len: usize, stream: StreamHandle) -> Result<()> {
        let _ctx = self.bind()?;
        // SAFETY: the caller guarantees `dst..dst+len` is pinned memory, valid and otherwise
        // untouched until the copy completes on `stream`.
        let r = unsafe { sys::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, len, stream_ptr(stream)) };
        check("cuMemcpyDtoHAsync_v2", r, || format!("dst=0x{dst:x} src=0x{src:x} len={len} stream=0x{:x}", stream.0))
    }

    fn fill_pattern_async(
        &self,
        dst: DevicePtr,
        words: usize,
        seed: u64,
        first: u64,
        stream: StreamHandle,
    ) -> Result<()> {
        let kernels = self.kernels()?;
        let _ctx = self.bind()?;
        kernels.fill(dst, words, seed, first, stream)
    }

    fn check_pattern_async(
        &self,
        src: DevicePtr,
        words: usize,
        seed: u64,
        first: u64,
        counter: DevicePtr,
        stream: StreamHandle,
    ) -> Result<()> {
        let kernels = self.kernels()?;
        let _ctx = self.bind()?;
        kernels.check(src, words, seed, first, counter, stream)
    }

    fn copy_between_devices_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        let _ctx = self.bind()?;
        // SAFETY: device memory only, on both sides; the driver validates the ranges (in the
        // unified address space, on any GPU) and the stream.
        let r = unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, len, stream_ptr(stream)) };
        check("cuMemcpyDtoDAsync_v2", r, || format!("dst=0x{dst:x} src=0x{src:x} len={len} stream=0x{:x}", stream.0))
    }

    fn memset_async(&self, dst: DevicePtr, value: u8, len: usize, stream: StreamHandle) -> Result<()> {
        let _ctx = self.bind()?;
        // SAFETY: writes device memory only; the driver validates the range and stream. One
        // memset may span several chunk mappings (checked on the GPU by the tests).
        let r = unsafe { sys::cuMemsetD8Async(dst, value, len, stream_ptr(stream)) };
        check("cuMemsetD8Async", r, || format!("dst=0x{dst:x} value={value} len={len} stream=0x{:x}", stream.0))
    }

    fn write(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        let _ctx = self.bind()?;
        let len = src.len();
        // SAFETY: `src` is valid for `len` bytes for the duration of the call (the driver stages
        // pageable memory before returning); the device range is driver-validated.
        let r = unsafe { sys::cuMemcpyHtoD_v2(dst, src.as_ptr().cast(), len) };
        check("cuMemcpyHtoD_v2", r, || format!("dst=0x{dst:x} len={len}"))?;
        // From pageable memory the call may return once the bytes are staged, before the DMA
        // lands; it runs on the legacy default stream, so waiting for that stream finishes it.
        // SAFETY: stream 0 is the legacy default stream of the current context.
        let r = unsafe { sys::cuStreamSynchronize(ptr::null_mut()) };
        check("cuStreamSynchronize", r, || format!("legacy stream after write dst=0x{dst:x} len={len}"))
    }

    fn read(&self, src: DevicePtr, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let _ctx = self.bind()?;
        let len = dst.len();
        // SAFETY: `dst` is valid and exclusively borrowed for `len` bytes; to pageable memory the
        // call returns only once the copy has completed.
        let r = unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src, len) };
        check("cuMemcpyDtoH_v2", r, || format!("src=0x{src:x} len={len}"))
    }

    fn alloc_plain(&self, size: usize) -> Result<DevicePtr> {
        let _ctx = self.bind()?;
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer.
        let r = unsafe { sys::cuMemAlloc_v2(&mut p, size) };
        check("cuMemAlloc_v2", r, || format!("size={size}"))?;
        Ok(p)
    }

    fn free_plain(&self, ptr: DevicePtr) -> Result<()> {
        let _ctx = self.bind()?;
        // SAFETY: a pointer from `alloc_plain`; the driver rejects others.
        let r = unsafe { sys::cuMemFree_v2(ptr) };
        check("cuMemFree_v2", r, || format!("ptr=0x{ptr:x}"))
    }
}

impl CudaDevice {
    /// `cuMemCreate` of `granules` granules with `prop`, the properties of a chunk at `location`
    /// (shareable or not).
    pub(super) fn create_allocation(
        &self,
        prop: &sys::CUmemAllocationProp,
        location: ChunkLocation,
        granules: usize,
    ) -> Result<PhysHandle> {
        let _ctx = self.bind()?;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        let size = granules * self.granularity;
        // SAFETY: valid out-pointer; `prop` is fully initialised; size is whole granules; flags 0.
        let r = unsafe { sys::cuMemCreate(&mut handle, size, prop, 0) };
        let shareable = match prop.requestedHandleTypes == sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE {
            true => "",
            false => ", shareable as a POSIX fd",
        };
        let detail = || format!("size={size} at {location} (through GPU {}){shareable}", self.info.ordinal);
        check("cuMemCreate", r, detail).map_err(|e| match (e, location) {
            // Host memory ran out: say so rather than report HBM exhaustion.
            (DeviceError::OutOfMemory { call, detail }, ChunkLocation::Host) => DeviceError::Driver {
                call,
                code: "CUDA_ERROR_OUT_OF_MEMORY".to_string(),
                detail: format!("{detail}: host memory exhausted"),
            },
            (other, _) => other,
        })?;
        Ok(PhysHandle(handle))
    }
}
