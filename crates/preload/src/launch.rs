//! Kernel launches: each holds the gate while it enqueues (gate.rs), and its arguments are
//! scanned for pointers into tiermem's allocations, the launch-argument analysis of GDM (§5): a
//! buffer passed to a kernel is hot (hotness.rs counts them).
//!
//! The arguments come one of two ways. `kernelParams` is an array of pointers, one per kernel
//! parameter, whose sizes only the kernel knows: `cuFuncGetParamInfo` (CUDA 12.4) answers them
//! for a `CUfunction`, `cuKernelGetParamInfo` for a `CUkernel` passed in its place (the CUDA
//! runtime's library kernels). `extra` may instead carry one packed buffer
//! (`CU_LAUNCH_PARAM_BUFFER_POINTER`, `CU_LAUNCH_PARAM_BUFFER_SIZE`). Either way the whole
//! payload is read as 8-byte words at 8-byte offsets from each parameter's start — a pointer
//! argument is one word, and PyTorch's `multi_tensor_apply` passes arrays of addresses inside
//! one struct, so every word is a candidate, not only parameters of 8 bytes. A word that falls
//! in no allocation (most of them: sizes, strides, scalars) is dropped after two compares.
//! Where the driver cannot say a kernel's parameters (older than 12.4), its launches carry no
//! hotness: they still hold the gate, which is what safety needs.
//!
//! Stage 3 (cycle.rs) counts every launch against the plan of the cycle under way: the first
//! launch of a planned segment takes a pause before it takes the gate — the segment's moves
//! are made (migrate.rs's `carry`) — and each launch's pointers are recorded for the next plan.
//!
//! While no chunk is on the host no launch is scanned at all: nothing could move up, so the
//! hotness would be wasted, and a program that fits pays the gate only.

use std::cell::RefCell;
use std::ffi::{c_uint, c_void};
use std::time::Instant;

use crate::boundary::{enter, guard_step, inside, to_driver, CuResult, CUDA_SUCCESS};
use crate::cycle;
use crate::driver::{driver, ParamInfoFn, Stream};
use crate::gate;
use crate::hotness;
use crate::trace;
use crate::wrappers::wrappers;

type Function = *mut c_void;
type Params = *mut *mut c_void;

/// `CU_LAUNCH_PARAM_*`: the keys of `extra`.
const PARAM_END: usize = 0;
const PARAM_BUFFER_POINTER: usize = 1;
const PARAM_BUFFER_SIZE: usize = 2;
/// More parameters than any kernel has (the driver's limit is 32 KiB of them): a bound on the
/// loop asking for them, in case a driver never answers "no such parameter".
const MAX_PARAMS: usize = 4096;
/// At most this many (key, value) pairs of `extra` are read.
const MAX_EXTRA: usize = 16;

thread_local! {
    /// The candidate pointers of the launch being scanned (kept to spare an allocation per launch).
    static FOUND: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Holds the gate while kernel `f` is launched on `stream`, after the pause stage 3's plan or
/// stage 2 has due before it; records its pointers if hotness is wanted, and for the graph
/// being captured if `stream` is (`name`, the entry point: a `_ptsz` one names the per-thread
/// default stream by null).
fn launch(
    name: &'static str,
    call: impl FnOnce() -> CuResult,
    f: Function,
    params: Params,
    extra: Params,
    stream: Stream,
) -> CuResult {
    if inside() {
        return to_driver(call);
    }
    wait_for_turn(name);
    // Stage 3: the first launch of a planned segment waits for its chunks (cycle.rs).
    if let Some(boundary) = cycle::before_launch(f as usize) {
        guard_step(name, || {
            let started = Instant::now();
            if let Some(moved) = crate::migrate::carry(name, &boundary) {
                cycle::paused(started.elapsed().as_nanos() as u64, moved);
            }
        });
    }
    pause_if_due(name);
    let _gate = gate::shared();
    let captured = gate::capturing().then_some(stream);
    if hotness::scanning() || captured.is_some() {
        let _inside = enter();
        // A bug in scanning must not stop the launch: a panic only loses this launch's hotness.
        // SAFETY: the caller's launch arguments, which the driver is about to read the same way.
        let _ = std::panic::catch_unwind(|| unsafe { record(name, f, params, extra, captured) });
    } else {
        cycle::record(f as usize, &[]);
    }
    to_driver(call)
}

/// The node daemon's turn (turns.rs): a launch waits while the program is told to wait, and
/// the first after a wait takes a pause, bringing up the chunks the cut sent down.
fn wait_for_turn(name: &'static str) {
    if crate::turns::wait_for_turn(name) {
        guard_step(name, || {
            crate::migrate::turn_begins(name);
        });
    }
}

/// A program that has not synchronized for a while: a pause of tiermem's own before launch
/// `name` (migrate.rs).
fn pause_if_due(name: &'static str) {
    if crate::migrate::pause_due() {
        guard_step(name, || {
            crate::migrate::pause_point(name);
        });
    }
}

/// `launch` for `cuLaunchKernelEx`, whose configuration comes first and names the stream.
fn launch_ex(
    name: &'static str,
    call: impl FnOnce() -> CuResult,
    config: *const c_void,
    f: Function,
    params: Params,
    extra: Params,
) -> CuResult {
    // `CUlaunchConfig`: seven `unsigned int`s (grid, block, shared memory), then `hStream`.
    const STREAM_OFFSET: usize = 32;
    let stream = match config.is_null() {
        true => std::ptr::null_mut(),
        // SAFETY: a non-null configuration is the caller's `CUlaunchConfig`, which the driver
        // reads too; its `hStream` is at offset 32 on 64-bit targets.
        false => unsafe { config.cast::<u8>().add(STREAM_OFFSET).cast::<Stream>().read_unaligned() },
    };
    launch(name, call, f, params, extra, stream)
}

/// `launch` for `cuLaunchCooperativeKernel`, which has no `extra`.
fn launch_cooperative(
    name: &'static str,
    call: impl FnOnce() -> CuResult,
    f: Function,
    params: Params,
    stream: Stream,
) -> CuResult {
    launch(name, call, f, params, std::ptr::null_mut(), stream)
}

/// A graph's replay (`cuGraphLaunch`): the pause stage 2 has due before it, then, holding the
/// gate, the pointers its capture's launches passed counted for hotness (graphs.rs). Not a
/// launch of stage 3's cycles (graphs.rs says why).
fn graph_launch(name: &'static str, call: impl FnOnce() -> CuResult, exec: *mut c_void) -> CuResult {
    if inside() {
        return to_driver(call);
    }
    wait_for_turn(name);
    pause_if_due(name);
    let _gate = gate::shared();
    let scanned = hotness::scanning();
    {
        let _inside = enter();
        // As for a kernel's launch: a panic only loses this replay's hotness.
        let _ = std::panic::catch_unwind(|| {
            let words = crate::graphs::replayed(exec, scanned);
            if scanned {
                let count = words.as_ref().map_or("null".to_owned(), |w| w.len().to_string());
                trace::event("graph_launch", || format!("\"exec\": {}, \"pointers\": {count}", exec as usize));
            }
            if let Some(words) = words {
                hotness::record_replay(&words);
            }
        });
    }
    to_driver(call)
}

/// Scans one launch's arguments and records the words that fall in tiermem's allocations: for
/// hotness, the trace, stage 3's cycle, and the capture under way on `captured` (a stream).
///
/// # Safety
/// `params` and `extra` as the driver's launch functions take them for kernel `f`.
unsafe fn record(name: &str, f: Function, params: Params, extra: Params, captured: Option<Stream>) {
    FOUND.with(|found| {
        let mut found = found.borrow_mut();
        found.clear();
        if !params.is_null() {
            // SAFETY: passed on from the caller.
            unsafe { scan_params(f, params, &mut found) };
        } else if !extra.is_null() {
            // SAFETY: passed on from the caller.
            unsafe { scan_extra(extra, &mut found) };
        }
        // A captured launch runs only in the graph's replays, which count its pointers then:
        // neither heat nor a launch of the cycle now (stage 3 would plan for kernels that do
        // not come).
        if captured.is_some_and(|stream| crate::graphs::launched(stream, name.ends_with("_ptsz"), &found)) {
            return;
        }
        let on_host = hotness::record(&found);
        if on_host > 0 && trace::on() {
            let (launch, _, _) = hotness::launch_counts();
            let kernel = kernel_name(f).map_or("null".to_owned(), |name| trace::quoted(&name));
            let chunks: Vec<String> =
                hotness::host_chunks_of(&found).iter().map(|(va, i)| format!("[{va}, {i}]")).collect();
            let in_cycle = cycle::launches_so_far();
            trace::event("launch_on_host", || {
                format!(
                    "\"launch\": {launch}, \"in_cycle\": {in_cycle}, \"kernel\": {kernel}, \"host_pointers\": {on_host}, \"host_chunks\": [{}]",
                    chunks.join(",")
                )
            });
        }
        cycle::record(f as usize, &found);
    });
}

/// `f`'s name as the driver says it (`cuFuncGetName`, else `cuKernelGetName` for a `CUkernel`
/// passed in its place), for the trace.
fn kernel_name(f: Function) -> Option<String> {
    let driver = driver()?;
    [driver.func_get_name, driver.kernel_get_name].into_iter().flatten().find_map(|query| {
        let mut name: *const std::ffi::c_char = std::ptr::null();
        // SAFETY: a valid out-pointer; the driver validates the handle.
        let ok = unsafe { query(&mut name, f) } == CUDA_SUCCESS && !name.is_null();
        // SAFETY: on success the driver returns a NUL-terminated string it owns and keeps.
        ok.then(|| unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy().into_owned())
    })
}

/// The driver's query that knows `f`'s parameters: `cuFuncGetParamInfo` for a `CUfunction`,
/// `cuKernelGetParamInfo` for a `CUkernel` passed in its place (the CUDA runtime's library
/// kernels) — whichever answers for parameter 0 — and parameter 0's size. `None` for a kernel
/// without parameters, or a driver that cannot say.
fn param_query(f: Function) -> Option<(ParamInfoFn, usize)> {
    let driver = driver()?;
    [driver.func_get_param_info, driver.kernel_get_param_info]
        .into_iter()
        .flatten()
        .find_map(|query| Some((query, param_size(query, f, 0)?)))
}

/// The size of parameter `index` of `f` as `query` answers it, or `None` past the last.
fn param_size(query: ParamInfoFn, f: Function, index: usize) -> Option<usize> {
    let (mut offset, mut size) = (0usize, 0usize);
    // SAFETY: valid out-pointers; the driver validates the handle and the index.
    (unsafe { query(f, index, &mut offset, &mut size) } == CUDA_SUCCESS).then_some(size)
}

/// # Safety
/// `params` holds one pointer per parameter of `f`, each to that parameter's value.
unsafe fn scan_params(f: Function, params: Params, found: &mut Vec<u64>) {
    // Parameter 0 decides which query knows `f`, for every parameter after it too.
    let Some((query, first)) = param_query(f) else { return };
    let mut index = 0;
    let mut size = Some(first);
    while let Some(bytes) = size.filter(|_| index < MAX_PARAMS) {
        // SAFETY: `params` has an entry for each parameter the kernel has.
        let value = unsafe { *params.add(index) };
        if !value.is_null() {
            // SAFETY: the entry points to the parameter's `bytes` bytes.
            unsafe { scan_words(value.cast::<u8>(), bytes, found) };
        }
        index += 1;
        size = param_size(query, f, index);
    }
}

/// # Safety
/// `extra` is a `CU_LAUNCH_PARAM_END`-terminated list of (key, value) pairs, as the driver takes it.
unsafe fn scan_extra(extra: Params, found: &mut Vec<u64>) {
    let (mut buffer, mut size): (*const u8, Option<usize>) = (std::ptr::null(), None);
    for pair in 0..MAX_EXTRA {
        // SAFETY: the list holds pairs until its END key (read first).
        let key = unsafe { *extra.add(2 * pair) } as usize;
        if key == PARAM_END {
            break;
        }
        // SAFETY: as above: a key other than END has its value after it.
        let value = unsafe { *extra.add(2 * pair + 1) };
        match key {
            PARAM_BUFFER_POINTER => buffer = value.cast::<u8>(),
            // SAFETY: the BUFFER_SIZE value points to a size_t.
            PARAM_BUFFER_SIZE if !value.is_null() => size = Some(unsafe { *value.cast::<usize>() }),
            _ => {}
        }
    }
    if let (false, Some(size)) = (buffer.is_null(), size) {
        // SAFETY: the buffer holds `size` bytes: the launch's packed arguments.
        unsafe { scan_words(buffer, size, found) };
    }
}

/// Each 8-byte word at an 8-byte offset in `bytes..bytes+len` that may be a pointer of tiermem's.
///
/// # Safety
/// `bytes` valid for reads of `len` bytes (no alignment needed).
unsafe fn scan_words(bytes: *const u8, len: usize, found: &mut Vec<u64>) {
    for offset in (0..len / 8).map(|word| word * 8) {
        // SAFETY: `offset + 8 <= len`; an unaligned read of a plain integer.
        let word = unsafe { bytes.add(offset).cast::<u64>().read_unaligned() };
        if hotness::may_hold(word) {
            found.push(word);
        }
    }
}

wrappers! { launch_routes:
    cuLaunchKernel(
        f: Function, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: Stream, params: Params, extra: Params
    ) => launch(f, params, extra, stream);
    cuLaunchKernel_ptsz(
        f: Function, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: Stream, params: Params, extra: Params
    ) => launch(f, params, extra, stream);
    cuLaunchKernelEx(config: *const c_void, f: Function, params: Params, extra: Params) => launch_ex(config, f, params, extra);
    cuLaunchKernelEx_ptsz(config: *const c_void, f: Function, params: Params, extra: Params) => launch_ex(config, f, params, extra);
    cuLaunchCooperativeKernel(
        f: Function, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: Stream, params: Params
    ) => launch_cooperative(f, params, stream);
    cuLaunchCooperativeKernel_ptsz(
        f: Function, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: Stream, params: Params
    ) => launch_cooperative(f, params, stream);
    cuGraphLaunch(exec: *mut c_void, stream: Stream) => graph_launch(exec);
    cuGraphLaunch_ptsz(exec: *mut c_void, stream: Stream) => graph_launch(exec);
}
