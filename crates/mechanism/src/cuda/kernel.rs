//! A copy done by the multiprocessors instead of a copy engine.
//!
//! On the H200 (driver 580) mapping memory (`cuMemMap`, `cuMemSetAccess`) waits while a copy
//! engine copies device memory to the host: ~320 µs instead of ~23 µs per chunk. A kernel that
//! reads device memory and writes pinned host memory over PCIe (reachable at the same address,
//! through unified addressing) moves the same bytes without that copy engine. The kernel is
//! PTX, compiled by the driver when first used, so building tiermem still needs no CUDA.

use super::driver::check;
use super::{stream_ptr, CudaDevice};
use crate::{DeviceError, DevicePtr, HostPtr, Result, StreamHandle};
use cudarc::driver::sys;
use std::ffi::c_void;

/// `tiermem_copy16(dst, src, count)`: copies `count` 16-byte words, grid-stride.
const COPY_PTX: &str = "\
.version 7.0
.target sm_80
.address_size 64
.visible .entry tiermem_copy16(.param .u64 dst, .param .u64 src, .param .u64 count)
{
    .reg .pred %p;
    .reg .b32 %r<5>;
    .reg .b32 %v<4>;
    .reg .b64 %rd<10>;
    ld.param.u64 %rd1, [dst];
    ld.param.u64 %rd2, [src];
    ld.param.u64 %rd3, [count];
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd4, %r1, %r2;
    cvt.u64.u32 %rd5, %r3;
    add.u64 %rd4, %rd4, %rd5;
    mul.wide.u32 %rd6, %r4, %r2;
LOOP:
    setp.ge.u64 %p, %rd4, %rd3;
    @%p bra DONE;
    shl.b64 %rd7, %rd4, 4;
    add.u64 %rd8, %rd2, %rd7;
    ld.global.v4.u32 {%v0, %v1, %v2, %v3}, [%rd8];
    add.u64 %rd9, %rd1, %rd7;
    st.global.v4.u32 [%rd9], {%v0, %v1, %v2, %v3};
    add.u64 %rd4, %rd4, %rd6;
    bra LOOP;
DONE:
    ret;
}
\0";

const THREADS: u32 = 256;
const BLOCKS: u32 = 1024;

impl CudaDevice {
    fn copy_kernel(&self) -> Result<sys::CUfunction> {
        let loaded = self.copy_kernel.get_or_init(|| {
            let _ctx = self.bind()?;
            let mut module: sys::CUmodule = std::ptr::null_mut();
            // SAFETY: COPY_PTX is a NUL-terminated PTX image; valid out-pointer.
            let r = unsafe { sys::cuModuleLoadData(&mut module, COPY_PTX.as_ptr().cast()) };
            check("cuModuleLoadData", r, || "the copy kernel's PTX".into())?;
            let mut function: sys::CUfunction = std::ptr::null_mut();
            // SAFETY: `module` was just loaded; the name is NUL-terminated.
            let r = unsafe { sys::cuModuleGetFunction(&mut function, module, c"tiermem_copy16".as_ptr()) };
            check("cuModuleGetFunction", r, || "tiermem_copy16".into())?;
            Ok(function as usize)
        });
        loaded.clone().map(|f| f as sys::CUfunction)
    }

    /// Enqueues the copy kernel: `len` bytes (a multiple of 16) from `src` to `dst`.
    pub(super) fn kernel_copy(&self, dst: u64, src: u64, len: usize, stream: StreamHandle) -> Result<()> {
        if len % 16 != 0 {
            return Err(DeviceError::Driver {
                call: "cuLaunchKernel",
                code: "CUDA_ERROR_INVALID_VALUE".into(),
                detail: format!("tiermem_copy16 copies multiples of 16 bytes, not {len}"),
            });
        }
        let function = self.copy_kernel()?;
        let _ctx = self.bind()?;
        let (mut dst, mut src, mut count) = (dst, src, (len / 16) as u64);
        let mut params: [*mut c_void; 3] =
            [(&raw mut dst).cast(), (&raw mut src).cast(), (&raw mut count).cast()];
        // SAFETY: `params` points to three u64 values matching the kernel's parameters, alive
        // for the call (the driver copies them at launch); the caller guarantees both ranges.
        let r = unsafe {
            sys::cuLaunchKernel(function, BLOCKS, 1, 1, THREADS, 1, 1, 0, stream_ptr(stream), params.as_mut_ptr(), std::ptr::null_mut())
        };
        check("cuLaunchKernel", r, || format!("tiermem_copy16 dst=0x{dst:x} src=0x{src:x} len={len}"))
    }

    /// A copy to pinned host memory by the kernel (see the module docs).
    pub(super) fn kernel_copy_to_host(&self, dst: HostPtr, src: DevicePtr, len: usize, stream: StreamHandle) -> Result<()> {
        self.kernel_copy(dst as u64, src, len, stream)
    }
}
