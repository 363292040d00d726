//! Contexts a program creates itself (`cuCtxCreate_v2`), as the driver keeps them: each of one
//! GPU, current on the thread that created it (pushed on its stack of contexts), made current
//! elsewhere with `cuCtxSetCurrent` or `cuCtxPushCurrent_v2`, and destroyed with
//! `cuCtxDestroy_v2`, which frees every plain allocation made while it was current (memory.rs
//! tags each with its context) — VMM memory outlives it, as the driver's does. Their handles
//! lie above the primary contexts' (`OWN_FIRST`). Synchronizations of each are counted, so
//! that tests can tell that tiermem waited for it.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::{Mutex, MutexGuard};

use crate::*;

/// The first handle of a context of the program's own; the next ones follow by `PRIMARY_STRIDE`.
pub(crate) const OWN_FIRST: usize = 0x7e60_0000;

struct Own {
    gpu: usize,
    syncs: usize,
}

struct Contexts {
    live: BTreeMap<usize, Own>,
    next: usize,
}

static CONTEXTS: Mutex<Contexts> = Mutex::new(Contexts { live: BTreeMap::new(), next: OWN_FIRST });

thread_local! {
    /// The contexts below the current one on this thread's stack (`cuCtxPushCurrent_v2`).
    static BELOW: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

fn contexts() -> MutexGuard<'static, Contexts> {
    CONTEXTS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The GPU of the program's context `ctx`, if it is a live one.
pub(crate) fn gpu_of(ctx: usize) -> Option<usize> {
    contexts().live.get(&ctx).map(|own| own.gpu)
}

/// A synchronization of the thread's current context `ctx`, counted if it is the program's.
pub(crate) fn synchronized(ctx: usize) {
    if let Some(own) = contexts().live.get_mut(&ctx) {
        own.syncs += 1;
    }
}

/// `ctx` made current on this thread, the one current before pushed below it.
fn push(ctx: usize) {
    let before = CURRENT.with(|current| current.replace(ctx));
    BELOW.with(|below| below.borrow_mut().push(before));
}

/// # Safety
/// As the driver's: `ctx` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(ctx: *mut *mut c_void, _flags: c_uint, device: c_int) -> Code {
    if ctx.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let code = device::with_gpu(device, |_, gpu| {
        let mut all = contexts();
        let handle = all.next;
        all.next += PRIMARY_STRIDE;
        all.live.insert(handle, Own { gpu, syncs: 0 });
        // SAFETY: checked non-null; the caller's out-pointer.
        unsafe { *ctx = handle as *mut c_void };
        CUDA_SUCCESS
    });
    if code == CUDA_SUCCESS {
        // SAFETY: written just now.
        push(unsafe { *ctx } as usize);
    }
    code
}

/// Frees the context's plain allocations; popped from this thread's stack if current here.
#[no_mangle]
pub extern "C" fn cuCtxDestroy_v2(ctx: *mut c_void) -> Code {
    if contexts().live.remove(&(ctx as usize)).is_none() {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    with(|fake| {
        fake.memory.free_plain_of(ctx as usize);
        CUDA_SUCCESS
    });
    if CURRENT.with(Cell::get) == ctx as usize {
        let below = BELOW.with(|below| below.borrow_mut().pop()).unwrap_or(0);
        CURRENT.with(|current| current.set(below));
    }
    CUDA_SUCCESS
}

#[no_mangle]
pub extern "C" fn cuCtxPushCurrent_v2(ctx: *mut c_void) -> Code {
    if !device::known_context(ctx as usize) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    push(ctx as usize);
    CUDA_SUCCESS
}

/// # Safety
/// As the driver's: `ctx` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(ctx: *mut *mut c_void) -> Code {
    let Some(below) = BELOW.with(|below| below.borrow_mut().pop()) else { return CUDA_ERROR_INVALID_CONTEXT };
    let popped = CURRENT.with(|current| current.replace(below));
    if !ctx.is_null() {
        // SAFETY: checked non-null; the caller's out-pointer.
        unsafe { *ctx = popped as *mut c_void };
    }
    CUDA_SUCCESS
}

/// How many times the program's context `ctx` was synchronized, or -1 if it is not a live
/// one. Not a driver function.
#[no_mangle]
pub extern "C" fn tiermem_fake_context_syncs(ctx: *mut c_void) -> isize {
    contexts().live.get(&(ctx as usize)).map_or(-1, |own| own.syncs as isize)
}
