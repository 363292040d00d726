//! The schedule recorder's C entry points: a program (or the preload library) that repeats
//! its steps every pass says when a pass begins and which step it enters, naming buffers by
//! device pointer; the process engine records the first pass and from then on pages ahead
//! along it and evicts by next use (the engine's recorder.rs explains how steps are located).
//!
//! Several programs may take turns in one engine (two models, say): each gets a schedule of its
//! own, found by the first step of its pass, and `tiermem_forget_steps` forgets one program's
//! when it is gone. Like every entry point these return a [`TiermemStatus`], keep a message
//! naming the function for `tiermem_last_error()`, never unwind, and may be called from any
//! thread (the engine serialises them).

use crate::process;
use crate::status::{entry, Failure, TiermemStatus};
use std::sync::Arc;
use tiermem::BufferId;

/// A pass of the program begins (a model's forward, say). The first pass after this is
/// recorded from `tiermem_step_enters`; when the next pass begins, the recorded steps become
/// the engine's schedule.
#[no_mangle]
pub extern "C" fn tiermem_pass_begins() -> TiermemStatus {
    entry("tiermem_pass_begins", || Ok(process::require_engine()?.pass_begins()?))
}

/// The program enters the step named `key` (any number, the same for the same step every
/// pass), which uses the `count` allocations containing `ptrs[0..count]`. While the first pass
/// is recorded this notes the step; once the schedule is known it finds the step and starts
/// paging in what is missing from the coming steps, `prefetch_bytes` of them. `*out_step`
/// (if not NULL) gets the step found, or -1 (recording, or a step the schedule lacks).
///
/// # Safety
/// `ptrs` is valid for reads of `count` values (it may be NULL when `count` is 0); `out_step`
/// is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tiermem_step_enters(
    key: u64,
    ptrs: *const u64,
    count: usize,
    prefetch_bytes: usize,
    out_step: *mut i64,
) -> TiermemStatus {
    entry("tiermem_step_enters", || {
        // SAFETY: the caller promises `count` readable values at `ptrs`.
        let ptrs = unsafe { values("ptrs", ptrs, count, "the step's pointers") }?;
        let engine = process::require_engine()?;
        let buffers = ptrs
            .iter()
            .map(|&ptr| {
                let found = process::find(ptr)?;
                match Arc::ptr_eq(&found.value.engine, &engine) {
                    true => Ok(found.value.id),
                    false => Err(Failure::invalid(format!(
                        "0x{ptr:x} belongs to an engine that is no longer the process's (allocate it again)"
                    ))),
                }
            })
            .collect::<Result<Vec<BufferId>, Failure>>()?;
        let step = engine.step_enters(key, &buffers, prefetch_bytes)?;
        // SAFETY: the caller promises `out_step` is NULL or valid for a write.
        if let Some(out) = unsafe { out_step.as_mut() } {
            *out = step.map_or(-1, |s| s as i64);
        }
        Ok(())
    })
}

/// Forgets the recorded schedule of the program whose steps include any of the `count` keys
/// `keys[0..count]` (a model that was freed, in an engine shared with other programs), keeping
/// the others'. Keys no schedule has are ignored.
///
/// # Safety
/// `keys` is valid for reads of `count` values (it may be NULL when `count` is 0).
#[no_mangle]
pub unsafe extern "C" fn tiermem_forget_steps(keys: *const u64, count: usize) -> TiermemStatus {
    entry("tiermem_forget_steps", || {
        // SAFETY: the caller promises `count` readable values at `keys`.
        let keys = unsafe { values("keys", keys, count, "the steps' keys") }?;
        process::require_engine()?.forget_steps(keys);
        Ok(())
    })
}

/// The `count` values at `ptr` (named `name` in the error, which asks for `what`): NULL is
/// refused unless `count` is 0.
///
/// # Safety
/// Where `ptr` is not NULL it is valid for reads of `count` values for `'a`.
unsafe fn values<'a>(name: &str, ptr: *const u64, count: usize, what: &str) -> Result<&'a [u64], Failure> {
    match (ptr.is_null(), count) {
        (_, 0) => Ok(&[]),
        (true, _) => Err(Failure::invalid(format!("{name} is NULL but count is {count}: pass {what}"))),
        // SAFETY: non-null, and the caller promises `count` readable values.
        (false, _) => Ok(unsafe { std::slice::from_raw_parts(ptr, count) }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::tests::SERIAL;
    use tiermem::{AllocOptions, EngineConfig};

    fn step_enters(key: u64, ptrs: &[u64]) -> (TiermemStatus, i64) {
        let mut step = -2;
        // SAFETY: `ptrs` is a live slice of `ptrs.len()` values, `step` a live i64.
        let status = unsafe { tiermem_step_enters(key, ptrs.as_ptr(), ptrs.len(), 0, &mut step) };
        (status, step)
    }

    #[test]
    fn the_first_pass_is_recorded_and_later_passes_find_their_steps() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let config = EngineConfig {
            backend: "sim".parse().unwrap(),
            hbm_limit: Some(8 << 20),
            sim_hbm: 16 << 20,
            ..EngineConfig::default()
        };
        process::init(config).unwrap();
        let ptrs: Vec<u64> = (0..3).map(|_| process::alloc(2 << 20, AllocOptions::default(), None).unwrap()).collect();
        for pass in 0..3 {
            assert_eq!(tiermem_pass_begins(), TiermemStatus::Ok);
            for (i, &ptr) in ptrs.iter().enumerate() {
                let expected = if pass == 0 { -1 } else { i as i64 };
                // A pointer inside the allocation names it too.
                assert_eq!(step_enters(7 + i as u64, &[ptr + 5, ptr]), (TiermemStatus::Ok, expected));
            }
        }
        assert_eq!(process::engine().unwrap().recorded_steps(), vec![7, 8, 9]);
        // A second program's passes are recorded beside the first's, then forgotten alone.
        for _ in 0..2 {
            assert_eq!(tiermem_pass_begins(), TiermemStatus::Ok);
            assert_eq!(step_enters(20, &[ptrs[2]]).0, TiermemStatus::Ok);
            assert_eq!(step_enters(21, &[ptrs[0]]).0, TiermemStatus::Ok);
        }
        let mut recorded = process::engine().unwrap().recorded_steps();
        recorded.sort_unstable();
        assert_eq!(recorded, vec![7, 8, 9, 20, 21]);
        // SAFETY: a live slice of one key.
        assert_eq!(unsafe { tiermem_forget_steps([21].as_ptr(), 1) }, TiermemStatus::Ok);
        assert_eq!(process::engine().unwrap().recorded_steps(), vec![7, 8, 9]);
        // SAFETY: a NULL `keys` with a count is refused before it is read.
        assert_eq!(unsafe { tiermem_forget_steps(std::ptr::null(), 1) }, TiermemStatus::InvalidArgument);
        assert!(crate::status::take_last_error().unwrap().starts_with("tiermem_forget_steps: keys is NULL"));
        // SAFETY: a NULL `keys` with no count is never read.
        assert_eq!(unsafe { tiermem_forget_steps(std::ptr::null(), 0) }, TiermemStatus::Ok);
        assert_eq!(step_enters(1, &[0x10]).0, TiermemStatus::InvalidArgument);
        assert!(crate::status::take_last_error().unwrap().starts_with("tiermem_step_enters: 0x10 was not allocated"));
        // SAFETY: a NULL `ptrs` with a count is refused before it is read.
        let status = unsafe { tiermem_step_enters(1, std::ptr::null(), 2, 0, std::ptr::null_mut()) };
        assert_eq!(status, TiermemStatus::InvalidArgument);
        for ptr in ptrs {
            process::free(ptr, false, tiermem::StreamHandle(0)).unwrap();
        }
        process::shutdown().unwrap();
        assert_eq!(tiermem_pass_begins(), TiermemStatus::NotInitialized);
    }
}
