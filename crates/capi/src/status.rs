//! Status codes, the thread's last error message, and the guard every entry point runs in.
//!
//! A C caller gets a [`TiermemStatus`]; the sentence explaining it (which call failed, why, and
//! what to do) is kept per thread for `tiermem_last_error`, as `dlerror` does. [`entry`] runs
//! an entry point's body under `catch_unwind`, so a panic inside tiermem becomes
//! `TIERMEM_STATUS_INTERNAL` instead of unwinding into C (which is undefined behaviour).

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use tiermem::Error;

/// What a C entry point returns; 0 is success. `tiermem_last_error()` says more.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TiermemStatus {
    Ok = 0,
    /// A size, range, pointer or setting that cannot be right (including a null pointer).
    InvalidArgument = 1,
    /// No process-wide engine: call `tiermem_init` first.
    NotInitialized = 2,
    /// Every tier that could take the data is full.
    OutOfMemory = 3,
    /// More was asked to be resident at once than the HBM cap.
    WouldNeverFit = 4,
    /// The buffer does not exist, is acquired, is not acquired, or is read-only.
    BufferState = 5,
    /// The GPU driver (or the simulated device) failed.
    Device = 6,
    /// The file tier failed: no space, an I/O error, a corrupted slot.
    FileTier = 7,
    /// A bug in tiermem (it panicked); the process may go on, the call did not complete.
    Internal = 8,
}

/// A failed call: its status and the whole message, which names the call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub status: TiermemStatus,
    pub message: String,
}

impl Failure {
    pub fn new(status: TiermemStatus, message: impl Into<String>) -> Self {
        Self { status, message: message.into() }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(TiermemStatus::InvalidArgument, message)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

/// The status of an engine error (the same classes as the Python exceptions).
pub fn status_of(error: &Error) -> TiermemStatus {
    match error {
        Error::OutOfMemory { .. } => TiermemStatus::OutOfMemory,
        Error::WouldNeverFit { .. } => TiermemStatus::WouldNeverFit,
        Error::ZeroSize { .. }
        | Error::OutOfRange { .. }
        | Error::UnknownTicket { .. }
        | Error::Config(_)
        | Error::Conflict { .. }
        | Error::Schedule { .. } => TiermemStatus::InvalidArgument,
        Error::UnknownBuffer { .. }
        | Error::Acquired { .. }
        | Error::NotAcquired { .. }
        | Error::ReadOnly { .. }
        | Error::AcquiredInPlace { .. } => TiermemStatus::BufferState,
        Error::Device { .. } => TiermemStatus::Device,
        Error::File { .. } => TiermemStatus::FileTier,
        Error::PartlyWritten { source, .. } => status_of(source),
        Error::MustWait(_) => TiermemStatus::Internal,
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        Self::new(status_of(&error), error.to_string())
    }
}

thread_local! {
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

fn set_last_error(message: &str) {
    // A message is text we wrote or the engine's Display: an interior NUL would be a bug, but
    // must not lose the message, so it is replaced.
    let text = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|slot| *slot.borrow_mut() = Some(text));
}

/// The last failure's message on this thread, cleared (for front ends that report it once).
pub fn take_last_error() -> Option<String> {
    LAST_ERROR.with(|slot| slot.borrow_mut().take()).map(|m| m.to_string_lossy().into_owned())
}

/// The last failure's message on this thread, kept.
pub fn last_error_message() -> Option<String> {
    LAST_ERROR.with(|slot| slot.borrow().as_ref().map(|m| m.to_string_lossy().into_owned()))
}

/// The message of the last call that failed on this thread, or NULL if none has. The string
/// belongs to tiermem and stays valid until the next failing call on this thread.
#[no_mangle]
pub extern "C" fn tiermem_last_error() -> *const c_char {
    // Only reads a thread-local: nothing here can panic but a failed borrow, which cannot
    // happen since no other code on this thread holds it while C runs.
    LAST_ERROR
        .with(|slot| slot.try_borrow().ok().and_then(|m| m.as_ref().map(|m| m.as_ptr())).unwrap_or(std::ptr::null()))
}

/// Runs an entry point's body: never unwinds, records a failure's message (prefixed with
/// `call`, the C function's name) for `tiermem_last_error`, and returns the status.
pub fn entry(call: &'static str, body: impl FnOnce() -> Result<(), Failure>) -> TiermemStatus {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => TiermemStatus::Ok,
        Ok(Err(failure)) => {
            record(call, &failure.message);
            failure.status
        }
        Err(_) => {
            record(call, "internal error (tiermem panicked; please report it with the program's stderr)");
            TiermemStatus::Internal
        }
    }
}

/// Keeps `call: message` as this thread's last error and returns it.
pub fn record(call: &str, message: &str) -> String {
    let message = format!("{call}: {message}");
    set_last_error(&message);
    message
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn last() -> String {
        let ptr = tiermem_last_error();
        assert!(!ptr.is_null());
        // SAFETY: a non-null result points at this thread's NUL-terminated message, alive
        // until the next failing call on this thread.
        unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned()
    }

    #[test]
    fn a_failure_keeps_its_message_per_thread() {
        let status = entry("tiermem_test", || Err(Failure::invalid("size 0: pass a size above zero")));
        assert_eq!(status, TiermemStatus::InvalidArgument);
        assert_eq!(last(), "tiermem_test: size 0: pass a size above zero");
        std::thread::spawn(|| assert!(tiermem_last_error().is_null(), "another thread has its own")).join().unwrap();
        assert_eq!(entry("tiermem_test", || Ok(())), TiermemStatus::Ok);
        assert_eq!(take_last_error().as_deref(), Some("tiermem_test: size 0: pass a size above zero"));
        assert!(tiermem_last_error().is_null());
    }

    #[test]
    fn a_panic_becomes_a_status() {
        let status = entry("tiermem_test", || panic!("boom"));
        assert_eq!(status, TiermemStatus::Internal);
        assert!(last().starts_with("tiermem_test: internal error"));
    }

    #[test]
    fn engine_errors_keep_their_class() {
        let failure = Failure::from(Error::WouldNeverFit { call: "acquire", requested: 8, cap: 4 });
        assert_eq!(failure.status, TiermemStatus::WouldNeverFit);
        assert!(failure.message.starts_with("acquire: 8 bytes can never be resident"));
    }
}
