//! The fake's CUDA graphs, made by stream capture as PyTorch and Inductor make them.
//!
//! `cuStreamBeginCapture_v2` starts recording a stream: a kernel launched on it while it is
//! captured is recorded (the kernel and its parameters' bytes) instead of run;
//! `cuStreamEndCapture` makes the recording a graph, `cuGraphInstantiateWithFlags` (and the
//! older `cuGraphInstantiate_v2`) an executable graph, and `cuGraphLaunch` runs its launches
//! in order, each as kernel.rs runs one (pointer arguments dereferenced, a fault where a chunk
//! is not mapped). `cuStreamGetCaptureInfo` (the original three-argument one) says whether a
//! stream is being captured and the capture's id. Only the captured stream's own launches are
//! recorded (no streams joining a capture through events).

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::*;

/// `CU_STREAM_CAPTURE_STATUS_NONE` / `_ACTIVE`.
const NOT_CAPTURING: c_int = 0;
const CAPTURING: c_int = 1;
/// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`… the family's first: ending a stream not captured.
const CUDA_ERROR_ILLEGAL_STATE: Code = 401;

/// One recorded launch: the kernel, and each parameter's bytes.
struct Launch {
    f: usize,
    values: Vec<Vec<u8>>,
}

#[derive(Default)]
struct Graphs {
    /// Stream → (capture id, launches recorded).
    captures: HashMap<usize, (u64, Vec<Launch>)>,
    graphs: HashMap<usize, Arc<Vec<Launch>>>,
    execs: HashMap<usize, Arc<Vec<Launch>>>,
    next: usize,
}

static GRAPHS: Mutex<Option<Graphs>> = Mutex::new(None);

fn graphs() -> MutexGuard<'static, Option<Graphs>> {
    GRAPHS.lock().unwrap_or_else(|p| p.into_inner())
}

fn state(guard: &mut Option<Graphs>) -> &mut Graphs {
    guard.get_or_insert_with(|| Graphs { next: 0x6a00_0000, ..Graphs::default() })
}

/// Records a launch of `f` on `stream` if the stream is being captured: `Some` of what the
/// launch answers then, `None` if it runs now.
///
/// # Safety
/// `params` null or one pointer per parameter of `f`, each to a value of that parameter's size.
pub(crate) unsafe fn captured(stream: *mut c_void, f: *mut c_void, params: *mut *mut c_void) -> Option<Code> {
    let mut guard = graphs();
    let (_, launches) = state(&mut guard).captures.get_mut(&(stream as usize))?;
    let Some(sizes) = kernel::sizes(f) else { return Some(kernel::CUDA_ERROR_INVALID_HANDLE) };
    let values = match params.is_null() {
        true => Vec::new(),
        // SAFETY: one pointer per parameter, each to `size` bytes (the caller's contract).
        false => sizes
            .iter()
            .enumerate()
            .map(|(i, &size)| unsafe { std::slice::from_raw_parts((*params.add(i)).cast::<u8>(), size) }.to_vec())
            .collect(),
    };
    launches.push(Launch { f: f as usize, values });
    Some(CUDA_SUCCESS)
}

#[no_mangle]
pub extern "C" fn cuStreamBeginCapture_v2(stream: *mut c_void, _mode: c_int) -> Code {
    if let Err(code) = current_context() {
        return code;
    }
    let mut guard = graphs();
    let graphs = state(&mut guard);
    graphs.next += 0x10;
    let id = graphs.next as u64;
    match graphs.captures.insert(stream as usize, (id, Vec::new())) {
        Some(earlier) => {
            graphs.captures.insert(stream as usize, earlier);
            CUDA_ERROR_ILLEGAL_STATE
        }
        None => CUDA_SUCCESS,
    }
}

/// # Safety
/// As the driver's: `graph` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(stream: *mut c_void, graph: *mut *mut c_void) -> Code {
    let mut guard = graphs();
    let graphs = state(&mut guard);
    let Some((_, launches)) = graphs.captures.remove(&(stream as usize)) else { return CUDA_ERROR_ILLEGAL_STATE };
    graphs.next += 0x10;
    let handle = graphs.next;
    graphs.graphs.insert(handle, Arc::new(launches));
    // SAFETY: the caller's out-pointer.
    unsafe { put(graph, handle as *mut c_void) }
}

/// # Safety
/// As the driver's: `status` and `id` null or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo(stream: *mut c_void, status: *mut c_int, id: *mut u64) -> Code {
    // SAFETY: passed on from the caller.
    unsafe { capture_info(stream, status, id) }
}

/// # Safety
/// As the driver's: `status` and `id` null or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_ptsz(stream: *mut c_void, status: *mut c_int, id: *mut u64) -> Code {
    // SAFETY: passed on from the caller.
    unsafe { capture_info(stream, status, id) }
}

/// # Safety
/// `status` and `id` null or valid for writes.
unsafe fn capture_info(stream: *mut c_void, status: *mut c_int, id: *mut u64) -> Code {
    let capture = state(&mut graphs()).captures.get(&(stream as usize)).map(|(id, _)| *id);
    // SAFETY: the caller's out-pointers.
    match unsafe { put(status, if capture.is_some() { CAPTURING } else { NOT_CAPTURING }) } {
        // SAFETY: as above; the id is only written for a stream being captured, as the driver's.
        CUDA_SUCCESS if capture.is_some() && !id.is_null() => unsafe { put(id, capture.unwrap_or(0)) },
        code => code,
    }
}

/// # Safety
/// As the driver's: `exec` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(exec: *mut *mut c_void, graph: *mut c_void, _flags: u64) -> Code {
    let mut guard = graphs();
    let graphs = state(&mut guard);
    let Some(launches) = graphs.graphs.get(&(graph as usize)).cloned() else {
        return kernel::CUDA_ERROR_INVALID_HANDLE;
    };
    graphs.next += 0x10;
    let handle = graphs.next;
    graphs.execs.insert(handle, launches);
    // SAFETY: the caller's out-pointer.
    unsafe { put(exec, handle as *mut c_void) }
}

/// The older instantiation (CUDA 11's `cuGraphInstantiate_v2`): as [`cuGraphInstantiateWithFlags`].
///
/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    exec: *mut *mut c_void,
    graph: *mut c_void,
    _error_node: *mut *mut c_void,
    _log: *mut std::ffi::c_char,
    _log_size: usize,
) -> Code {
    // SAFETY: passed on from the caller.
    unsafe { cuGraphInstantiateWithFlags(exec, graph, 0) }
}

/// Runs the executable graph's launches in order (work is never in flight).
#[no_mangle]
pub extern "C" fn cuGraphLaunch(exec: *mut c_void, stream: *mut c_void) -> Code {
    graph_launch(exec, stream)
}

#[no_mangle]
pub extern "C" fn cuGraphLaunch_ptsz(exec: *mut c_void, stream: *mut c_void) -> Code {
    graph_launch(exec, stream)
}

fn graph_launch(exec: *mut c_void, _stream: *mut c_void) -> Code {
    let Some(launches) = state(&mut graphs()).execs.get(&(exec as usize)).cloned() else {
        return kernel::CUDA_ERROR_INVALID_HANDLE;
    };
    for launch in launches.iter() {
        let mut values: Vec<Vec<u8>> = launch.values.clone();
        let mut params: Vec<*mut c_void> = values.iter_mut().map(|v| v.as_mut_ptr().cast::<c_void>()).collect();
        let params = if params.is_empty() { std::ptr::null_mut() } else { params.as_mut_ptr() };
        // SAFETY: one pointer per parameter, each to that parameter's recorded bytes.
        let code = unsafe { kernel::run(launch.f as *mut c_void, params) };
        if code != CUDA_SUCCESS {
            return code;
        }
    }
    CUDA_SUCCESS
}

#[no_mangle]
pub extern "C" fn cuGraphExecDestroy(exec: *mut c_void) -> Code {
    match state(&mut graphs()).execs.remove(&(exec as usize)) {
        Some(_) => CUDA_SUCCESS,
        None => kernel::CUDA_ERROR_INVALID_HANDLE,
    }
}

#[no_mangle]
pub extern "C" fn cuGraphDestroy(graph: *mut c_void) -> Code {
    match state(&mut graphs()).graphs.remove(&(graph as usize)) {
        Some(_) => CUDA_SUCCESS,
        None => kernel::CUDA_ERROR_INVALID_HANDLE,
    }
}
