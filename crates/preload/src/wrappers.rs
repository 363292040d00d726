//! One macro for the routed driver functions whose wrapper only adds a step around the driver's
//! own call (hold the gate, mark a quiesce point, count a capture, scan launch arguments):
//! given each function's versioned name and C signature (from `cuda.h`), it writes the exported
//! wrapper and the table of (name, wrapper) that routes.rs swaps real pointers with.
//!
//! Each wrapper finds the driver's function of the same name once (the real `dlsym` on
//! libcuda's handle, driver.rs) and hands a closure calling it to its *hook*, with whichever of
//! its arguments the hook asks for:
//!
//! ```text
//! wrappers! { table_name:
//!     cuMemcpyAsync(dst: u64, src: u64, bytes: usize, stream: Stream) => enqueue;
//!     cuLaunchKernel(f: Function, …, params: Params, extra: Params) => launch(f, params, extra);
//! }
//! ```
//!
//! A hook is `fn(name: &'static str, call: impl FnOnce() -> CuResult, …) -> CuResult`. Names
//! must be the driver's exported, versioned ones (`cuMemcpyHtoD_v2`, `cuMemsetD8Async_ptsz`):
//! a name the loaded driver lacks is simply not routed.

use std::ffi::{c_void, CStr};
use std::sync::OnceLock;

use crate::driver::driver;

/// The driver's exported function `name` (NUL-terminated) as the function pointer type `F`.
pub fn real_entry<F: Copy>(name: &'static str) -> Option<F> {
    assert_eq!(size_of::<F>(), size_of::<*mut c_void>(), "a function pointer type");
    let name = CStr::from_bytes_with_nul(name.as_bytes()).ok()?;
    let found = driver()?.symbol(name);
    // SAFETY: `F` is the C signature of `name` in cuda.h (the wrappers! invocation names both),
    // and a function pointer has the size of a data pointer (asserted above).
    (!found.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, F>(&found) })
}

/// The driver's exported function `name` (NUL-terminated) as `F`, looked up once into `cell`.
pub fn cached_entry<F: Copy>(cell: &'static OnceLock<Option<F>>, name: &'static str) -> Option<F> {
    *cell.get_or_init(|| real_entry(name))
}

/// A routed function: its versioned name and tiermem's wrapper.
pub type Route = (&'static CStr, *mut c_void);

/// `name` (NUL-terminated by the macro) as a C string.
pub fn c_name(name: &'static str) -> &'static CStr {
    CStr::from_bytes_with_nul(name.as_bytes()).expect("wrappers! names are NUL-terminated identifiers")
}

/// See the module documentation.
macro_rules! wrappers {
    ($table:ident: $( $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) => $hook:ident $( ( $($hook_arg:ident),* ) )? ; )*) => {
        $(
            #[doc = concat!("`", stringify!($name), "`: the driver's, through `", stringify!($hook), "`.")]
            ///
            /// # Safety
            /// As the driver's.
            #[no_mangle]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::boundary::CuResult {
                type Real = unsafe extern "C" fn($($ty),*) -> $crate::boundary::CuResult;
                static REAL: std::sync::OnceLock<Option<Real>> = std::sync::OnceLock::new();
                let real = $crate::wrappers::cached_entry(&REAL, concat!(stringify!($name), "\0"));
                let Some(real) = real else { return $crate::boundary::CUDA_ERROR_NOT_INITIALIZED };
                // SAFETY: the driver's own function, called with the caller's arguments unchanged.
                $hook(stringify!($name), move || unsafe { real($($arg),*) } $( $(, $hook_arg)* )?)
            }
        )*

        /// The routed functions of this module: versioned name, wrapper.
        pub fn $table() -> Vec<$crate::wrappers::Route> {
            vec![$( ($crate::wrappers::c_name(concat!(stringify!($name), "\0")), $name as *mut std::ffi::c_void) ),*]
        }
    };
}

pub(crate) use wrappers;
