//! The pattern kernels ([`crate::pattern`] on the GPU), for `tiermem soak` and the GPU tests:
//! kernels that write and read device memory through its mapping, as a program's would.
//!
//! The kernels are PTX, written by hand and JIT-compiled by the driver the first time one is
//! launched (so the build needs no CUDA toolkit). Each is a grid-stride loop over 8-byte
//! words; word `i` of a launch is word `first + i` of the pattern of `seed`:
//! `z = seed ^ (first + i)·φ`, then SplitMix64's finaliser. `tiermem_check` adds the number
//! of words that differ to a 32-bit counter in device memory (`atom.global.add`).

use std::ffi::c_void;
use std::ptr;

use cudarc::driver::sys;

use super::driver::check;
use crate::{DevicePtr, Result, StreamHandle};

/// PTX ISA 8.0 (CUDA 12.0 and newer drivers), for sm_90 (H100/H200) and anything the driver
/// can JIT it for. The three constants are φ·2^64 and SplitMix64's multipliers, as signed
/// 64-bit decimals, the way nvcc writes them.
const PTX: &str = r#"
.version 8.0
.target sm_90
.address_size 64

.visible .entry tiermem_fill(.param .u64 dst, .param .u64 words, .param .u64 seed, .param .u64 first)
{
    .reg .pred %p;
    .reg .b32 %r<5>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [dst];
    ld.param.u64 %rd2, [words];
    ld.param.u64 %rd3, [seed];
    ld.param.u64 %rd4, [first];
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd5, %r1, %r2;
    cvt.u64.u32 %rd6, %r3;
    add.u64 %rd5, %rd5, %rd6;
    mul.wide.u32 %rd7, %r4, %r2;
FILL_LOOP:
    setp.ge.u64 %p, %rd5, %rd2;
    @%p bra FILL_DONE;
    add.u64 %rd8, %rd4, %rd5;
    mul.lo.u64 %rd8, %rd8, -7046029254386353131;
    xor.b64 %rd8, %rd8, %rd3;
    shr.u64 %rd9, %rd8, 30;
    xor.b64 %rd8, %rd8, %rd9;
    mul.lo.u64 %rd8, %rd8, -4658895280553007687;
    shr.u64 %rd9, %rd8, 27;
    xor.b64 %rd8, %rd8, %rd9;
    mul.lo.u64 %rd8, %rd8, -7723592293110705685;
    shr.u64 %rd9, %rd8, 31;
    xor.b64 %rd8, %rd8, %rd9;
    shl.b64 %rd10, %rd5, 3;
    add.u64 %rd10, %rd1, %rd10;
    st.global.u64 [%rd10], %rd8;
    add.u64 %rd5, %rd5, %rd7;
    bra FILL_LOOP;
FILL_DONE:
    ret;
}

.visible .entry tiermem_check(.param .u64 src, .param .u64 words, .param .u64 seed, .param .u64 first, .param .u64 counter)
{
    .reg .pred %p;
    .reg .b32 %r<6>;
    .reg .b64 %rd<13>;
    ld.param.u64 %rd1, [src];
    ld.param.u64 %rd2, [words];
    ld.param.u64 %rd3, [seed];
    ld.param.u64 %rd4, [first];
    ld.param.u64 %rd11, [counter];
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd5, %r1, %r2;
    cvt.u64.u32 %rd6, %r3;
    add.u64 %rd5, %rd5, %rd6;
    mul.wide.u32 %rd7, %r4, %r2;
CHECK_LOOP:
    setp.ge.u64 %p, %rd5, %rd2;
    @%p bra CHECK_DONE;
    add.u64 %rd8, %rd4, %rd5;
    mul.lo.u64 %rd8, %rd8, -7046029254386353131;
    xor.b64 %rd8, %rd8, %rd3;
    shr.u64 %rd9, %rd8, 30;
    xor.b64 %rd8, %rd8, %rd9;
    mul.lo.u64 %rd8, %rd8, -4658895280553007687;
    shr.u64 %rd9, %rd8, 27;
    xor.b64 %rd8, %rd8, %rd9;
    mul.lo.u64 %rd8, %rd8, -7723592293110705685;
    shr.u64 %rd9, %rd8, 31;
    xor.b64 %rd8, %rd8, %rd9;
    shl.b64 %rd10, %rd5, 3;
    add.u64 %rd10, %rd1, %rd10;
    ld.global.u64 %rd12, [%rd10];
    setp.eq.u64 %p, %rd12, %rd8;
    @%p bra CHECK_NEXT;
    atom.global.add.u32 %r5, [%rd11], 1;
CHECK_NEXT:
    add.u64 %rd5, %rd5, %rd7;
    bra CHECK_LOOP;
CHECK_DONE:
    ret;
}
"#;

/// Threads per block and the most blocks per launch (a grid-stride loop covers the rest).
const BLOCK: u32 = 256;
const MAX_BLOCKS: u64 = 1024;

/// The loaded module and its two kernels.
pub(super) struct Kernels {
    module: sys::CUmodule,
    fill: sys::CUfunction,
    check: sys::CUfunction,
}

// SAFETY: module and function handles are immutable driver objects, usable from any thread
// whose current context is the one they were loaded in (the device binds it before use).
unsafe impl Send for Kernels {}
// SAFETY: as above; launching never mutates `Kernels`.
unsafe impl Sync for Kernels {}

impl Kernels {
    /// JIT-compiles the PTX in the current context.
    pub fn load() -> Result<Self> {
        let image = std::ffi::CString::new(PTX).expect("the PTX has no NUL byte");
        let mut module: sys::CUmodule = ptr::null_mut();
        // SAFETY: valid out-pointer; `image` is a NUL-terminated PTX text that outlives the call.
        let r = unsafe { sys::cuModuleLoadData(&mut module, image.as_ptr().cast()) };
        check("cuModuleLoadData", r, || "the pattern kernels' PTX (sm_90, ISA 8.0)".into())?;
        let function = |name: &std::ffi::CStr| -> Result<sys::CUfunction> {
            let mut f: sys::CUfunction = ptr::null_mut();
            // SAFETY: valid out-pointer, a module just loaded, a NUL-terminated name.
            let r = unsafe { sys::cuModuleGetFunction(&mut f, module, name.as_ptr()) };
            check("cuModuleGetFunction", r, || format!("{name:?}"))?;
            Ok(f)
        };
        match (function(c"tiermem_fill"), function(c"tiermem_check")) {
            (Ok(fill), Ok(check)) => Ok(Self { module, fill, check }),
            (Err(e), _) | (_, Err(e)) => {
                // SAFETY: the module was loaded above and nothing uses it.
                unsafe { sys::cuModuleUnload(module) };
                Err(e)
            }
        }
    }

    /// Enqueues `tiermem_fill(dst, words, seed, first)`.
    pub fn fill(&self, dst: DevicePtr, words: usize, seed: u64, first: u64, stream: StreamHandle) -> Result<()> {
        let mut params = [dst, words as u64, seed, first];
        self.launch("cuLaunchKernel(tiermem_fill)", self.fill, words, &mut params, stream)
    }

    /// Enqueues `tiermem_check(src, words, seed, first, counter)`.
    pub fn check(
        &self,
        src: DevicePtr,
        words: usize,
        seed: u64,
        first: u64,
        counter: DevicePtr,
        stream: StreamHandle,
    ) -> Result<()> {
        let mut params = [src, words as u64, seed, first, counter];
        self.launch("cuLaunchKernel(tiermem_check)", self.check, words, &mut params, stream)
    }

    fn launch(
        &self,
        call: &'static str,
        function: sys::CUfunction,
        words: usize,
        params: &mut [u64],
        stream: StreamHandle,
    ) -> Result<()> {
        if words == 0 {
            return Ok(());
        }
        let blocks = (words as u64).div_ceil(u64::from(BLOCK)).min(MAX_BLOCKS) as u32;
        let mut pointers: Vec<*mut c_void> = params.iter_mut().map(|p| (p as *mut u64).cast()).collect();
        // SAFETY: `function` is a kernel of our module whose parameters are all .u64, one per
        // entry of `params`, which outlive the call (the driver copies them at launch); the
        // memory the kernel touches is the caller's to name (the trait's contract).
        let r = unsafe {
            sys::cuLaunchKernel(
                function,
                blocks,
                1,
                1,
                BLOCK,
                1,
                1,
                0,
                super::stream_ptr(stream),
                pointers.as_mut_ptr(),
                ptr::null_mut(),
            )
        };
        check(call, r, || format!("words={words} blocks={blocks} stream=0x{:x}", stream.0))
    }
}

impl Drop for Kernels {
    fn drop(&mut self) {
        // SAFETY: the module was loaded in `load` and its kernels are no longer launched.
        unsafe { sys::cuModuleUnload(self.module) };
    }
}
