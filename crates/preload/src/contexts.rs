//! Contexts the program creates itself (`cuCtxCreate_v2/_v3/_v4`) instead of using the GPU's
//! primary one, as PyCUDA, cuda-python's examples and the CUDA samples' driver-API programs do.
//! Two things change with them.
//!
//! **Waiting for the GPU.** A migration moves a chunk only once no work that could touch it is
//! in flight (migrate.rs): it holds the gate, so that nothing new is enqueued, and waits for the
//! context. With contexts of the program's own the work may be in any of them, so [`synchronize`]
//! waits for the calling thread's current context, then for each of the program's own and the
//! primary context of each GPU tiermem manages, each made current on the thread for its wait
//! and the thread's own put back. A context on its way out is never among them: its
//! destruction takes it off the list under the gate, so no migration holds its handle then.
//! Green contexts (`cuGreenCtxCreate`) are not waited for this way: migration stops for good.
//!
//! **Destroying one.** The driver frees every allocation made in a context when the context is
//! destroyed. Tiermem's allocations are VMM memory, which outlives contexts (a buffer left in a
//! destroyed context would stay held and counted for the process's life). So tiermem remembers
//! the allocations made while one of the program's contexts was current ([`allocated`]) and,
//! before passing `cuCtxDestroy_v2` on, waits for that context and frees them, and forgets the
//! driver's own allocations it counted there (small and managed ones, which the driver frees
//! itself). Stream-ordered allocations belong to a memory pool, not to the context, and stay.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

use crate::boundary::{guard_step, inside, to_driver, CuResult, CUDA_SUCCESS};
use crate::driver::{driver, Context};
use crate::process::{self, Drain};
use crate::wrappers::wrappers;
use crate::{gate, migrate};

/// The program's live contexts, and the allocations made while each was current (pointer →
/// context), as addresses.
#[derive(Default)]
struct Own {
    contexts: BTreeSet<usize>,
    made_in: BTreeMap<u64, usize>,
}

static OWN: Mutex<Option<Own>> = Mutex::new(None);
/// Whether the program ever created a context: every allocation and free asks, with one read.
static ANY: AtomicBool = AtomicBool::new(false);

fn own() -> MutexGuard<'static, Option<Own>> {
    // Two maps of addresses: consistent after any panic.
    OWN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The calling thread's current context, if the driver says.
fn current() -> Option<Context> {
    let get = driver()?.ctx_get_current?;
    let mut ctx: Context = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the driver's cuCtxGetCurrent.
    (unsafe { get(&mut ctx) } == CUDA_SUCCESS).then_some(ctx)
}

/// Runs `body` with `ctx` current on the calling thread, then puts the thread's own back.
fn with_current<T>(ctx: Context, body: impl FnOnce() -> T) -> Option<T> {
    let before = current()?;
    if before == ctx {
        return Some(body());
    }
    let set = driver()?.ctx_set_current?;
    // SAFETY: a live context: one of the program's, off the list only under the gate (module
    // documentation), or a primary context tiermem holds retained.
    if unsafe { set(ctx) } != CUDA_SUCCESS {
        return None;
    }
    let result = body();
    // SAFETY: the context that was current on this thread a moment ago.
    unsafe { set(before) };
    Some(result)
}

/// Waits for the calling thread's current context and, if the program made contexts of its
/// own, for each of them and for the primary context of each GPU tiermem manages (module
/// documentation): whether every wait succeeded. Called with the gate held exclusively.
pub fn synchronize() -> bool {
    let Some(sync) = driver().and_then(|d| d.ctx_synchronize) else { return false };
    // SAFETY: the driver's cuCtxSynchronize, on this thread's current context.
    let wait = || unsafe { sync() } == CUDA_SUCCESS;
    if !wait() {
        return false;
    }
    if !ANY.load(Relaxed) {
        return true;
    }
    let theirs: Vec<usize> = own().as_ref().map(|own| own.contexts.iter().copied().collect()).unwrap_or_default();
    let primaries = process::managed_gpus().into_iter().filter_map(primary);
    let all: Vec<Context> = theirs.into_iter().map(|ctx| ctx as Context).chain(primaries).collect();
    all.into_iter().all(|ctx| with_current(ctx, wait) == Some(true))
}

/// GPU `ordinal`'s primary context: tiermem holds it retained while it manages the GPU, so the
/// reference taken here to learn its handle is dropped at once.
fn primary(ordinal: usize) -> Option<Context> {
    let driver = driver()?;
    let (retain, release) = (driver.primary_ctx_retain?, driver.primary_ctx_release?);
    let device = c_int::try_from(ordinal).ok()?;
    let mut ctx: Context = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the driver's handles are the ordinals (process.rs).
    if unsafe { retain(&mut ctx, device) } != CUDA_SUCCESS {
        return None;
    }
    // SAFETY: the reference just taken.
    unsafe { release(device) };
    Some(ctx)
}

/// The program's allocation at `ptr` just succeeded: remembered if one of its own contexts is
/// current (the driver frees it with that context).
pub fn allocated(ptr: u64) {
    if !ANY.load(Relaxed) {
        return;
    }
    let Some(ctx) = current() else { return };
    if let Some(own) = own().as_mut().filter(|own| own.contexts.contains(&(ctx as usize))) {
        own.made_in.insert(ptr, ctx as usize);
    }
}

/// The program frees `ptr`: forgotten.
pub fn freed(ptr: u64) {
    if ANY.load(Relaxed) {
        if let Some(own) = own().as_mut() {
            own.made_in.remove(&ptr);
        }
    }
}

/// `cuCtxCreate_v2/_v3/_v4`: the new context, current on this thread, is the program's.
fn created(name: &'static str, call: impl FnOnce() -> CuResult, ctx: *mut Context) -> CuResult {
    let code = to_driver(call);
    if code == CUDA_SUCCESS && !ctx.is_null() && !inside() {
        // SAFETY: the driver wrote the new context's handle there.
        let ctx = unsafe { *ctx } as usize;
        guard_step(name, || {
            own().get_or_insert_with(Own::default).contexts.insert(ctx);
            ANY.store(true, Relaxed);
        });
    }
    code
}

/// `cuGreenCtxCreate`: a green context is not waited for (module documentation).
fn green_created(name: &'static str, call: impl FnOnce() -> CuResult) -> CuResult {
    {
        // As for a capture: a migration under way finishes first, a later one sees the mark.
        let _gate = (!inside()).then(gate::shared);
        gate::green_context();
    }
    migrate::stop(name, "the program creates a green context; migration does not wait for those");
    to_driver(call)
}

/// `cuCtxDestroy_v2` of one of the program's contexts: its work waited for, it comes off the
/// list, and the allocations made in it are freed, before the driver destroys it.
fn destroyed(name: &'static str, call: impl FnOnce() -> CuResult, ctx: Context) -> CuResult {
    let theirs = !inside() && own().as_ref().is_some_and(|own| own.contexts.contains(&(ctx as usize)));
    if theirs {
        guard_step(name, || {
            let_go(name, ctx);
        });
    }
    to_driver(call)
}

/// Frees what was made in the program's context `ctx`, as destroying it frees the driver's.
fn let_go(call: &str, ctx: Context) {
    // Its work first: then, as the program enqueues nothing in a context it destroys, nothing
    // in flight can touch its memory once no migration waits for it any more.
    // SAFETY: the driver's cuCtxSynchronize, on the context made current for it.
    let _ = with_current(ctx, || driver().and_then(|d| d.ctx_synchronize).map(|sync| unsafe { sync() }));
    let made: Vec<u64> = {
        // Off the list under the gate: a migration under way, which may be waiting for it,
        // finishes first.
        let _gate = gate::shared();
        let mut own = own();
        let Some(own) = own.as_mut() else { return };
        own.contexts.remove(&(ctx as usize));
        let (made, others) = std::mem::take(&mut own.made_in).into_iter().partition(|&(_, c)| c == ctx as usize);
        own.made_in = others;
        made.into_keys().collect()
    };
    let free_all = || {
        for &ptr in &made {
            // Not an error the program would see: the driver frees its memory whatever happens.
            if process::free(call, ptr, Drain::Context).is_none() {
                // The driver's own (small or managed), which it frees with the context.
                process::driver_free_done(process::take_driver_allocation(ptr), true);
            }
            // Kept for a graph (captures.rs): the graphs of the context go with it.
            let _ = crate::captures::forget(ptr);
        }
    };
    // With the context current, so that each free waits for its work; freed all the same if
    // it cannot be made current.
    if with_current(ctx, free_all).is_none() {
        free_all();
    }
}

wrappers! { context_routes:
    cuCtxCreate_v2(ctx: *mut Context, flags: c_uint, device: c_int) => created(ctx);
    cuCtxCreate_v3(ctx: *mut Context, params: *mut c_void, count: c_int, flags: c_uint, device: c_int) => created(ctx);
    cuCtxCreate_v4(ctx: *mut Context, params: *mut c_void, flags: c_uint, device: c_int) => created(ctx);
    cuGreenCtxCreate(ctx: *mut Context, desc: *mut c_void, device: c_int, flags: c_uint) => green_created;
    cuCtxDestroy_v2(ctx: Context) => destroyed(ctx);
}
