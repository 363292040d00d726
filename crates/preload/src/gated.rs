//! The routed calls around migration, other than launches (launch.rs): copies and memsets hold
//! the gate while they enqueue (gate.rs), synchronizations are quiesce points (migrate.rs), and
//! stream captures forbid migration while they last (the program's contexts: contexts.rs), and
//! a capture's graph and its instances keep the pointers its launches passed (graphs.rs).
//!
//! Copies and memsets are routed because another thread may enqueue one that touches a chunk
//! while it is being moved. The family routed is the one a CUDA program uses on linear device
//! memory, each with its per-thread variant (`_ptds` for the synchronous ones, `_ptsz` for the
//! asynchronous ones). PyTorch's copies come through `cuMemcpyAsync` (most of `copy_`),
//! `cuMemcpyHtoDAsync_v2`/`cuMemcpyDtoHAsync_v2`/`cuMemcpyDtoDAsync_v2` (explicit directions),
//! `cuMemcpy2DAsync_v2` (strided copies), `cuMemcpyPeerAsync` (between GPUs) and
//! `cuMemsetD8Async`/`cuMemsetD32Async` (`zero_`, `fill_` of bytes); all are here. So are the
//! copies between linear memory and CUDA arrays (`cuMemcpyAtoD_v2`, `cuMemcpyDtoA_v2`), the
//! batched copies (`cuMemcpyBatchAsync`, `cuMemcpy3DBatchAsync`: CUDA 12.8's and CUDA 13's
//! `_v2`) and the stream memory operations (`cuStreamWriteValue32`…, `cuStreamBatchMemOp`, v1
//! and v2), which read or write device addresses from a stream. Not routed: anything reached
//! without the driver's exported entry points.

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::boundary::{guard_step, inside, to_driver, CuResult, CUDA_SUCCESS};
use crate::driver::Stream;
use crate::gate;
use crate::wrappers::wrappers;

type Ctx = *mut c_void;
type Desc = *const c_void;
type Array = *mut c_void;

/// Holds the gate while the driver enqueues the call.
pub fn enqueue(_name: &'static str, call: impl FnOnce() -> CuResult) -> CuResult {
    if inside() {
        return to_driver(call);
    }
    let _gate = gate::shared();
    to_driver(call)
}

/// The driver's synchronization, then a quiesce point if it succeeded.
fn quiesce(name: &'static str, call: impl FnOnce() -> CuResult) -> CuResult {
    let code = to_driver(call);
    if code == CUDA_SUCCESS && !inside() {
        guard_step(name, || {
            crate::migrate::quiesce_point(name);
        });
    }
    code
}

/// A capture that began forbids migration until it ends.
fn capture_begins(_name: &'static str, call: impl FnOnce() -> CuResult) -> CuResult {
    // Counted before the call, under the gate: a migration either finished before the capture
    // begins, or sees it counted once it holds the gate (and then does not synchronize).
    let _gate = (!inside()).then(gate::shared);
    gate::capture(1);
    let code = to_driver(call);
    if code != CUDA_SUCCESS {
        gate::capture(-1);
    }
    code
}

/// `cuStreamEndCapture`: the capture is over when it succeeds or reports the capture broken
/// (`CUDA_ERROR_STREAM_CAPTURE_*`, 900 to 908); other errors (not capturing, a bad handle) end
/// none. The pointers its launches passed become the graph's (graphs.rs).
fn capture_ends(
    name: &'static str,
    call: impl FnOnce() -> CuResult,
    stream: Stream,
    graph: *mut *mut c_void,
) -> CuResult {
    let capture = (!inside()).then(|| crate::graphs::capture_of(stream, name.ends_with("_ptsz"))).flatten();
    let code = to_driver(call);
    let ended = code == CUDA_SUCCESS || (900..=908).contains(&code);
    if ended {
        gate::capture(-1);
    }
    if let Some(id) = capture.filter(|_| ended) {
        // SAFETY: the driver wrote the graph through the caller's out-pointer on success.
        let made = (code == CUDA_SUCCESS && !graph.is_null()).then(|| unsafe { *graph });
        guard_step(name, || crate::graphs::capture_ended(id, made));
    }
    code
}

/// A graph instantiated (any of the driver's ways): its instance replays the graph's pointers.
fn instantiate(
    name: &'static str,
    call: impl FnOnce() -> CuResult,
    exec: *mut *mut c_void,
    graph: *mut c_void,
) -> CuResult {
    let code = to_driver(call);
    if code == CUDA_SUCCESS && !exec.is_null() {
        // SAFETY: written by the driver through the caller's out-pointer on success.
        let exec = unsafe { *exec };
        guard_step(name, || crate::graphs::instantiated(exec, graph));
    }
    code
}

/// An executable graph destroyed: its pointers forgotten.
fn exec_destroyed(name: &'static str, call: impl FnOnce() -> CuResult, exec: *mut c_void) -> CuResult {
    let code = to_driver(call);
    if code == CUDA_SUCCESS {
        guard_step(name, || crate::graphs::exec_destroyed(exec));
    }
    code
}

/// A graph destroyed: its pointers forgotten (its instances keep theirs).
fn graph_destroyed(name: &'static str, call: impl FnOnce() -> CuResult, graph: *mut c_void) -> CuResult {
    let code = to_driver(call);
    if code == CUDA_SUCCESS {
        guard_step(name, || crate::graphs::graph_destroyed(graph));
    }
    code
}

wrappers! { copy_routes:
    cuMemcpy(dst: u64, src: u64, bytes: usize) => enqueue;
    cuMemcpy_ptds(dst: u64, src: u64, bytes: usize) => enqueue;
    cuMemcpyAsync(dst: u64, src: u64, bytes: usize, stream: Stream) => enqueue;
    cuMemcpyAsync_ptsz(dst: u64, src: u64, bytes: usize, stream: Stream) => enqueue;
    cuMemcpyPeer(dst: u64, dst_ctx: Ctx, src: u64, src_ctx: Ctx, bytes: usize) => enqueue;
    cuMemcpyPeer_ptds(dst: u64, dst_ctx: Ctx, src: u64, src_ctx: Ctx, bytes: usize) => enqueue;
    cuMemcpyPeerAsync(dst: u64, dst_ctx: Ctx, src: u64, src_ctx: Ctx, bytes: usize, stream: Stream) => enqueue;
    cuMemcpyPeerAsync_ptsz(dst: u64, dst_ctx: Ctx, src: u64, src_ctx: Ctx, bytes: usize, stream: Stream) => enqueue;
    cuMemcpyHtoD_v2(dst: u64, src: *const c_void, bytes: usize) => enqueue;
    cuMemcpyHtoD_v2_ptds(dst: u64, src: *const c_void, bytes: usize) => enqueue;
    cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, bytes: usize) => enqueue;
    cuMemcpyDtoH_v2_ptds(dst: *mut c_void, src: u64, bytes: usize) => enqueue;
    cuMemcpyDtoD_v2(dst: u64, src: u64, bytes: usize) => enqueue;
    cuMemcpyDtoD_v2_ptds(dst: u64, src: u64, bytes: usize) => enqueue;
    cuMemcpyHtoDAsync_v2(dst: u64, src: *const c_void, bytes: usize, stream: Stream) => enqueue;
    cuMemcpyHtoDAsync_v2_ptsz(dst: u64, src: *const c_void, bytes: usize, stream: Stream) => enqueue;
    cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: u64, bytes: usize, stream: Stream) => enqueue;
    cuMemcpyDtoHAsync_v2_ptsz(dst: *mut c_void, src: u64, bytes: usize, stream: Stream) => enqueue;
    cuMemcpyDtoDAsync_v2(dst: u64, src: u64, bytes: usize, stream: Stream) => enqueue;
    cuMemcpyDtoDAsync_v2_ptsz(dst: u64, src: u64, bytes: usize, stream: Stream) => enqueue;
    cuMemcpy2D_v2(copy: Desc) => enqueue;
    cuMemcpy2D_v2_ptds(copy: Desc) => enqueue;
    cuMemcpy2DUnaligned_v2(copy: Desc) => enqueue;
    cuMemcpy2DUnaligned_v2_ptds(copy: Desc) => enqueue;
    cuMemcpy2DAsync_v2(copy: Desc, stream: Stream) => enqueue;
    cuMemcpy2DAsync_v2_ptsz(copy: Desc, stream: Stream) => enqueue;
    cuMemcpy3D_v2(copy: Desc) => enqueue;
    cuMemcpy3D_v2_ptds(copy: Desc) => enqueue;
    cuMemcpy3DAsync_v2(copy: Desc, stream: Stream) => enqueue;
    cuMemcpy3DAsync_v2_ptsz(copy: Desc, stream: Stream) => enqueue;
    cuMemcpy3DPeer(copy: Desc) => enqueue;
    cuMemcpy3DPeer_ptds(copy: Desc) => enqueue;
    cuMemcpy3DPeerAsync(copy: Desc, stream: Stream) => enqueue;
    cuMemcpy3DPeerAsync_ptsz(copy: Desc, stream: Stream) => enqueue;
    cuMemcpyAtoD_v2(dst: u64, src: Array, offset: usize, bytes: usize) => enqueue;
    cuMemcpyAtoD_v2_ptds(dst: u64, src: Array, offset: usize, bytes: usize) => enqueue;
    cuMemcpyDtoA_v2(dst: Array, offset: usize, src: u64, bytes: usize) => enqueue;
    cuMemcpyDtoA_v2_ptds(dst: Array, offset: usize, src: u64, bytes: usize) => enqueue;
    // CUDA 12.8's batches (with `failIdx`), then CUDA 13's (`_v2`, without).
    cuMemcpyBatchAsync(
        dsts: *mut u64, srcs: *mut u64, sizes: *mut usize, count: usize, attrs: Desc, attr_indices: *mut usize,
        attr_count: usize, fail_index: *mut usize, stream: Stream
    ) => enqueue;
    cuMemcpyBatchAsync_ptsz(
        dsts: *mut u64, srcs: *mut u64, sizes: *mut usize, count: usize, attrs: Desc, attr_indices: *mut usize,
        attr_count: usize, fail_index: *mut usize, stream: Stream
    ) => enqueue;
    cuMemcpyBatchAsync_v2(
        dsts: *mut u64, srcs: *mut u64, sizes: *mut usize, count: usize, attrs: Desc, attr_indices: *mut usize,
        attr_count: usize, stream: Stream
    ) => enqueue;
    cuMemcpyBatchAsync_v2_ptsz(
        dsts: *mut u64, srcs: *mut u64, sizes: *mut usize, count: usize, attrs: Desc, attr_indices: *mut usize,
        attr_count: usize, stream: Stream
    ) => enqueue;
    cuMemcpy3DBatchAsync(ops: usize, list: Desc, fail_index: *mut usize, flags: u64, stream: Stream) => enqueue;
    cuMemcpy3DBatchAsync_ptsz(ops: usize, list: Desc, fail_index: *mut usize, flags: u64, stream: Stream) => enqueue;
    cuMemcpy3DBatchAsync_v2(ops: usize, list: Desc, flags: u64, stream: Stream) => enqueue;
    cuMemcpy3DBatchAsync_v2_ptsz(ops: usize, list: Desc, flags: u64, stream: Stream) => enqueue;
}

wrappers! { stream_memory_routes:
    cuStreamWriteValue32(stream: Stream, address: u64, value: u32, flags: c_uint) => enqueue;
    cuStreamWriteValue32_ptsz(stream: Stream, address: u64, value: u32, flags: c_uint) => enqueue;
    cuStreamWriteValue32_v2(stream: Stream, address: u64, value: u32, flags: c_uint) => enqueue;
    cuStreamWriteValue32_v2_ptsz(stream: Stream, address: u64, value: u32, flags: c_uint) => enqueue;
    cuStreamWriteValue64(stream: Stream, address: u64, value: u64, flags: c_uint) => enqueue;
    cuStreamWriteValue64_ptsz(stream: Stream, address: u64, value: u64, flags: c_uint) => enqueue;
    cuStreamWriteValue64_v2(stream: Stream, address: u64, value: u64, flags: c_uint) => enqueue;
    cuStreamWriteValue64_v2_ptsz(stream: Stream, address: u64, value: u64, flags: c_uint) => enqueue;
    cuStreamWaitValue32(stream: Stream, address: u64, value: u32, flags: c_uint) => enqueue;
    cuStreamWaitValue32_ptsz(stream: Stream, address: u64, value: u32, flags: c_uint) => enqueue;
    cuStreamWaitValue32_v2(stream: Stream, address: u64, value: u32, flags: c_uint) => enqueue;
    cuStreamWaitValue32_v2_ptsz(stream: Stream, address: u64, value: u32, flags: c_uint) => enqueue;
    cuStreamWaitValue64(stream: Stream, address: u64, value: u64, flags: c_uint) => enqueue;
    cuStreamWaitValue64_ptsz(stream: Stream, address: u64, value: u64, flags: c_uint) => enqueue;
    cuStreamWaitValue64_v2(stream: Stream, address: u64, value: u64, flags: c_uint) => enqueue;
    cuStreamWaitValue64_v2_ptsz(stream: Stream, address: u64, value: u64, flags: c_uint) => enqueue;
    cuStreamBatchMemOp(stream: Stream, count: c_uint, ops: Desc, flags: c_uint) => enqueue;
    cuStreamBatchMemOp_ptsz(stream: Stream, count: c_uint, ops: Desc, flags: c_uint) => enqueue;
    cuStreamBatchMemOp_v2(stream: Stream, count: c_uint, ops: Desc, flags: c_uint) => enqueue;
    cuStreamBatchMemOp_v2_ptsz(stream: Stream, count: c_uint, ops: Desc, flags: c_uint) => enqueue;
}

wrappers! { memset_routes:
    cuMemsetD8_v2(dst: u64, value: u8, count: usize) => enqueue;
    cuMemsetD8_v2_ptds(dst: u64, value: u8, count: usize) => enqueue;
    cuMemsetD16_v2(dst: u64, value: u16, count: usize) => enqueue;
    cuMemsetD16_v2_ptds(dst: u64, value: u16, count: usize) => enqueue;
    cuMemsetD32_v2(dst: u64, value: c_uint, count: usize) => enqueue;
    cuMemsetD32_v2_ptds(dst: u64, value: c_uint, count: usize) => enqueue;
    cuMemsetD2D8_v2(dst: u64, pitch: usize, value: u8, width: usize, height: usize) => enqueue;
    cuMemsetD2D8_v2_ptds(dst: u64, pitch: usize, value: u8, width: usize, height: usize) => enqueue;
    cuMemsetD2D16_v2(dst: u64, pitch: usize, value: u16, width: usize, height: usize) => enqueue;
    cuMemsetD2D16_v2_ptds(dst: u64, pitch: usize, value: u16, width: usize, height: usize) => enqueue;
    cuMemsetD2D32_v2(dst: u64, pitch: usize, value: c_uint, width: usize, height: usize) => enqueue;
    cuMemsetD2D32_v2_ptds(dst: u64, pitch: usize, value: c_uint, width: usize, height: usize) => enqueue;
    cuMemsetD8Async(dst: u64, value: u8, count: usize, stream: Stream) => enqueue;
    cuMemsetD8Async_ptsz(dst: u64, value: u8, count: usize, stream: Stream) => enqueue;
    cuMemsetD16Async(dst: u64, value: u16, count: usize, stream: Stream) => enqueue;
    cuMemsetD16Async_ptsz(dst: u64, value: u16, count: usize, stream: Stream) => enqueue;
    cuMemsetD32Async(dst: u64, value: c_uint, count: usize, stream: Stream) => enqueue;
    cuMemsetD32Async_ptsz(dst: u64, value: c_uint, count: usize, stream: Stream) => enqueue;
    cuMemsetD2D8Async(dst: u64, pitch: usize, value: u8, width: usize, height: usize, stream: Stream) => enqueue;
    cuMemsetD2D8Async_ptsz(dst: u64, pitch: usize, value: u8, width: usize, height: usize, stream: Stream) => enqueue;
    cuMemsetD2D16Async(dst: u64, pitch: usize, value: u16, width: usize, height: usize, stream: Stream) => enqueue;
    cuMemsetD2D16Async_ptsz(dst: u64, pitch: usize, value: u16, width: usize, height: usize, stream: Stream) => enqueue;
    cuMemsetD2D32Async(dst: u64, pitch: usize, value: c_uint, width: usize, height: usize, stream: Stream) => enqueue;
    cuMemsetD2D32Async_ptsz(dst: u64, pitch: usize, value: c_uint, width: usize, height: usize, stream: Stream) => enqueue;
}

wrappers! { sync_routes:
    cuCtxSynchronize() => quiesce;
    cuStreamSynchronize(stream: Stream) => quiesce;
    cuStreamSynchronize_ptsz(stream: Stream) => quiesce;
    cuEventSynchronize(event: *mut c_void) => quiesce;
}

wrappers! { capture_routes:
    cuStreamBeginCapture_v2(stream: Stream, mode: c_int) => capture_begins;
    cuStreamBeginCapture_v2_ptsz(stream: Stream, mode: c_int) => capture_begins;
    cuStreamBeginCaptureToGraph(
        stream: Stream, graph: *mut c_void, deps: *const c_void, data: *const c_void, count: usize, mode: c_int
    ) => capture_begins;
    cuStreamBeginCaptureToGraph_ptsz(
        stream: Stream, graph: *mut c_void, deps: *const c_void, data: *const c_void, count: usize, mode: c_int
    ) => capture_begins;
    cuStreamEndCapture(stream: Stream, graph: *mut *mut c_void) => capture_ends(stream, graph);
    cuStreamEndCapture_ptsz(stream: Stream, graph: *mut *mut c_void) => capture_ends(stream, graph);
}

wrappers! { graph_routes:
    cuGraphInstantiateWithFlags(exec: *mut *mut c_void, graph: *mut c_void, flags: u64) => instantiate(exec, graph);
    cuGraphInstantiate(
        exec: *mut *mut c_void, graph: *mut c_void, error_node: *mut *mut c_void, log: *mut c_char, log_size: usize
    ) => instantiate(exec, graph);
    cuGraphInstantiate_v2(
        exec: *mut *mut c_void, graph: *mut c_void, error_node: *mut *mut c_void, log: *mut c_char, log_size: usize
    ) => instantiate(exec, graph);
    cuGraphInstantiateWithParams(exec: *mut *mut c_void, graph: *mut c_void, params: *mut c_void) => instantiate(exec, graph);
    cuGraphInstantiateWithParams_ptsz(exec: *mut *mut c_void, graph: *mut c_void, params: *mut c_void) => instantiate(exec, graph);
    cuGraphExecDestroy(exec: *mut c_void) => exec_destroyed(exec);
    cuGraphDestroy(graph: *mut c_void) => graph_destroyed(graph);
}
