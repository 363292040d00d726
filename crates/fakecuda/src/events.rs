//! Events, as far as the fake goes: work is never in flight, so an event recorded is complete
//! at once — unless `TIERMEM_FAKE_EVENT_POLLS=N`, when each recorded event answers
//! `CUDA_ERROR_NOT_READY` to its first N queries (a test's stand-in for work still running).
//! `cuEventSynchronize` completes it.

use std::collections::BTreeMap;
use std::ffi::{c_uint, c_void};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

use crate::*;

const CUDA_ERROR_NOT_READY: Code = 600;

/// Live events: handle → queries left to answer "not ready".
static EVENTS: Mutex<BTreeMap<u64, u32>> = Mutex::new(BTreeMap::new());
static NEXT: AtomicU64 = AtomicU64::new(0x7e57_e000);

fn polls() -> u32 {
    static POLLS: OnceLock<u32> = OnceLock::new();
    *POLLS.get_or_init(|| std::env::var("TIERMEM_FAKE_EVENT_POLLS").ok().and_then(|v| v.parse().ok()).unwrap_or(0))
}

fn events() -> std::sync::MutexGuard<'static, BTreeMap<u64, u32>> {
    EVENTS.lock().unwrap_or_else(|p| p.into_inner())
}

/// # Safety
/// As the driver's: `event` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(event: *mut *mut c_void, _flags: c_uint) -> Code {
    if let Err(code) = current_context() {
        return code;
    }
    let handle = NEXT.fetch_add(1, Relaxed);
    events().insert(handle, 0);
    // SAFETY: the caller's out-pointer.
    unsafe { put(event, handle as usize as *mut c_void) }
}

#[no_mangle]
pub extern "C" fn cuEventRecord(event: *mut c_void, _stream: *mut c_void) -> Code {
    match events().get_mut(&(event as u64)) {
        Some(left) => {
            *left = polls();
            CUDA_SUCCESS
        }
        None => CUDA_ERROR_INVALID_VALUE,
    }
}

#[no_mangle]
pub extern "C" fn cuEventQuery(event: *mut c_void) -> Code {
    match events().get_mut(&(event as u64)) {
        Some(0) => CUDA_SUCCESS,
        Some(left) => {
            *left -= 1;
            CUDA_ERROR_NOT_READY
        }
        None => CUDA_ERROR_INVALID_VALUE,
    }
}

#[no_mangle]
pub extern "C" fn cuEventSynchronize(event: *mut c_void) -> Code {
    if let Err(code) = current_context() {
        return code;
    }
    if let Some(left) = events().get_mut(&(event as u64)) {
        *left = 0;
    }
    CUDA_SUCCESS
}

#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(event: *mut c_void) -> Code {
    events().remove(&(event as u64)).map_or(CUDA_ERROR_INVALID_VALUE, |_| CUDA_SUCCESS)
}

/// Destroys every event (a primary context's reset).
pub fn destroy_all() {
    events().clear();
}
