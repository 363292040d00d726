//! The edge between the host program and tiermem: driver result codes, the per-thread mark
//! "inside tiermem", and the guard every exported function runs in.
//!
//! While a thread runs tiermem's own code, its driver calls must reach the real driver: the
//! mechanism crate loads libcuda through cudarc, whose `dlsym` lookups land in our `dlsym`
//! (routes.rs), and a lookup of `cuMemAlloc_v2` there must not return tiermem's wrapper of it.
//! So [`enter`] marks the thread, and the overrides pass lookups through untouched while the
//! mark is set. An exported wrapper called on a marked thread (a driver that calls its own
//! exported symbols, say) passes straight through to the real function for the same reason.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A `CUresult`, as a plain integer: the real driver may return codes newer than any enum.
pub type CuResult = u32;

pub const CUDA_SUCCESS: CuResult = 0;
/// What the driver answers for a handle or pointer it cannot use.
pub const CUDA_ERROR_INVALID_VALUE: CuResult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CuResult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CuResult = 3;
pub const CUDA_ERROR_UNKNOWN: CuResult = 999;

thread_local! {
    static INSIDE: Cell<u32> = const { Cell::new(0) };
}

/// Marks the calling thread as running tiermem's code until dropped (nests).
pub struct Inside(());

impl Drop for Inside {
    fn drop(&mut self) {
        INSIDE.with(|depth| depth.set(depth.get().saturating_sub(1)));
    }
}

/// Marks the calling thread as inside tiermem; see the module documentation.
pub fn enter() -> Inside {
    INSIDE.with(|depth| depth.set(depth.get() + 1));
    Inside(())
}

/// Calls into the driver with the thread marked inside tiermem: a driver function that calls
/// another by its exported name (which the dynamic linker binds to ours) reaches the driver.
pub fn to_driver<R>(call: impl FnOnce() -> R) -> R {
    let _inside = enter();
    call()
}

/// Whether the calling thread is running tiermem's code.
pub fn inside() -> bool {
    INSIDE.with(|depth| depth.get() > 0)
}

/// [`guard`] for a step of tiermem's own that answers nothing to the program (books kept, a
/// pause taken): run inside tiermem, a panic logged as an internal error and not passed on.
pub fn guard_step(call: &str, step: impl FnOnce()) {
    guard(call, || {
        step();
        CUDA_SUCCESS
    });
}

/// Runs an exported function's body inside tiermem, never unwinding into the caller: a panic
/// (a bug in tiermem) is logged as one line and answered with `CUDA_ERROR_UNKNOWN`.
pub fn guard(call: &str, body: impl FnOnce() -> CuResult) -> CuResult {
    let _inside = enter();
    catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|payload| {
        let what = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        log(call, &format!("internal error ({what})"), "please report it; run without tiermem meanwhile");
        CUDA_ERROR_UNKNOWN
    })
}

/// The one form of tiermem's messages on stderr: `tiermem: <call>: <what failed>; <what to do>`.
pub fn log(call: &str, what: &str, todo: &str) {
    eprintln!("tiermem: {call}: {what}; {todo}");
}

/// The switch `name` in the environment: `on`/`1`/`true` (or empty) or `off`/`0`/`false`; unset,
/// `default`; anything else is said on stderr and taken as `default`.
pub fn switch(name: &str, default: bool) -> bool {
    match std::env::var(name).as_deref() {
        Err(_) => default,
        Ok("on" | "1" | "true" | "") => true,
        Ok("off" | "0" | "false") => false,
        Ok(other) => {
            let taken = if default { "on" } else { "off" };
            log(name, &format!("{other:?} is neither on nor off"), &format!("taken as {taken}"));
            default
        }
    }
}
