//! tiermem's C ABI: `include/tiermem.h`, generated from this crate by cbindgen.
//!
//! ```text
//!  C programs · PyTorch's pluggable allocator · (later) the preload library
//!        │ device pointers
//!  ffi.rs · schedule.rs · torch.rs   entry points: never unwind, check pointers, return a status
//!        │
//!  process.rs                         the process-wide engine · index.rs: device pointer → allocation
//!        │
//!  tiermem (the engine)
//! ```
//!
//! A C program calls `tiermem_init` once (or sets `TIERMEM_*` variables and passes NULL),
//! then `tiermem_alloc`s buffers whose device addresses never change, and brackets GPU work
//! with `tiermem_acquire` / `tiermem_release` on its stream, naming ranges by device pointer.
//! A program that repeats its steps every pass can have its schedule recorded
//! (`tiermem_pass_begins`, `tiermem_step_enters`: schedule.rs), so tiermem pages ahead of it.
//! Every call returns a `TiermemStatus`; on failure `tiermem_last_error()` says which call
//! failed, why, and what to do (status.rs).
//!
//! Rust front ends link this crate as an rlib and use [`install`] to make their engine the
//! process's; the Python extension does so and re-exports the C symbols from its shared
//! library, which `tiermem.torch` hands to PyTorch.

mod ffi;
mod index;
mod process;
mod schedule;
mod status;
mod torch;

pub use ffi::{
    tiermem_acquire, tiermem_alloc, tiermem_config_default, tiermem_free, tiermem_init, tiermem_live_allocations,
    tiermem_lookup, tiermem_page_in, tiermem_page_out, tiermem_read, tiermem_release, tiermem_shutdown,
    tiermem_stats_json, tiermem_write, TiermemAllocOptions, TiermemConfig,
};
pub use index::{AddressIndex, Entry};
pub use process::{engine, init, install, live_allocations, shutdown};
pub use schedule::{tiermem_pass_begins, tiermem_step_enters};
pub use status::{status_of, take_last_error, tiermem_last_error, Failure, TiermemStatus};
pub use torch::{take_torch_error, tiermem_torch_free, tiermem_torch_malloc};
