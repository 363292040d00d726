//! `libtiermem_preload.so`: tiermem under an unmodified CUDA program (`tiermem run -- CMD`,
//! docs/transparent.md). Loaded with `LD_PRELOAD`, it interposes the CUDA **driver** API,
//! because every CUDA program reaches the driver dynamically — the runtime is linked
//! statically by nvcc's default, so hooking `cudaMalloc` would miss most programs, but
//! `libcuda.so.1` is always `dlopen`ed or linked dynamically.
//!
//! # The problem
//!
//! A program can reach a driver function three ways: by linking against libcuda (the dynamic
//! linker binds the name, and a preloaded library that exports the same name comes first);
//! by `dlopen("libcuda.so.1")` and `dlsym(handle, name)`, which searches only libcuda and what
//! it depends on, so an export of ours is never seen; and — what the CUDA runtime, and with it
//! PyTorch, JAX and CuPy, does for nearly everything — by `cuGetProcAddress`, which the
//! runtime itself found through `dlsym`. The third way adds versions: the caller names a base
//! symbol (`cuMemAlloc`) with the CUDA version it was built for and a stream flavour (legacy or
//! per-thread default stream), and the driver picks the function: `cuMemAlloc` for a caller
//! older than 3.2, `cuMemAlloc_v2` after, `cuMemAllocAsync_ptsz` for a per-thread caller.
//!
//! # The approach: route real pointers, not names
//!
//! The issue suggested generating a table of (symbol, version, flavour) → wrapper from the
//! CUDA headers, as HAMi-core keeps one by hand. tiermem does not need it, because it never
//! decides which version a caller gets: it asks the driver. The library exports `dlsym`,
//! `cuGetProcAddress` and `cuGetProcAddress_v2`; each calls the real one with the caller's
//! arguments unchanged, then looks the returned *pointer* up in one small table, built once,
//! that maps the real addresses of the routed functions (resolved by their versioned names in
//! the loaded libcuda: `cuMemAlloc_v2`, `cuMemAllocAsync_ptsz`, …) to tiermem's wrappers. A
//! hit returns the wrapper, anything else the real pointer. So:
//!
//! * the version logic stays the driver's, exactly: a caller built for CUDA 3.0 gets the old
//!   `cuMemAlloc` (not routed), a caller asking for a symbol the driver lacks, or with a
//!   version below what it supports, gets the driver's `CUDA_ERROR_NOT_FOUND`;
//! * the per-thread variants need no flag handling: the driver returns `_ptsz`'s address and
//!   the table maps it to the `_ptsz` wrapper, which knows that stream 0 is the thread's;
//! * a new driver adding a `_v3` of a routed function simply is not routed (it passes through,
//!   unmanaged) until its wrapper is added — never a wrong signature called, which is what a
//!   stale generated table risks;
//! * `dlsym` and `cuGetProcAddress` share one rule and one table (routes.rs), and a program
//!   asking `cuGetProcAddress` for `cuGetProcAddress` gets tiermem's as well;
//! * where the library gives two routed names one address (an alias, or two bodies its
//!   linker folded into one: the fake driver's legacy and per-thread variants in a release
//!   build), the address is told apart by what was asked: `dlsym`'s name, or
//!   `cuGetProcAddress`'s symbol and stream flavour.
//!
//! The routed functions are exported under their versioned names too, for programs linked
//! against libcuda.
//!
//! # Recursion
//!
//! tiermem's own driver calls go through the mechanism crate's `CudaDevice`, which loads
//! libcuda with cudarc — whose `dlsym` is ours. A per-thread mark (boundary.rs) is set while a
//! thread runs tiermem's code: our `dlsym` and `cuGetProcAddress` answer such a thread with the
//! real pointers, and a wrapper entered on it passes straight through to the driver. The real
//! `dlsym` itself is found with `dlvsym(RTLD_NEXT, "dlsym", <glibc version>)`, which does not
//! call `dlsym`.
//!
//! # Stage 1: always mapped
//!
//! Every allocation becomes VA reserved by tiermem with VMM chunks (32 MiB, process.rs) mapped into it: on
//! the GPU while the budget (`TIERMEM_HBM_LIMIT`) allows, in host memory after that
//! (`ChunkLocation::Host`), so the program never sees `CUDA_ERROR_OUT_OF_MEMORY` while host
//! memory lasts; its kernels reach host chunks over PCIe. Where they go at allocation is one
//! pure function (placement.rs).
//!
//! # Stage 2: migration at quiesce points
//!
//! What lands on the host is whatever was allocated last — for a training loop, activations,
//! the hottest bytes — so chunks must move, and moving one is safe only when no work that
//! could touch it is in flight, and none is enqueued while it moves. Launch arguments do not
//! reveal every pointer a kernel uses, so tiermem never moves a chunk because a launch did not
//! name it; it moves chunks only at *quiesce points* — the program's own synchronizations —
//! holding a *gate* that every routed launch, copy and memset holds while it enqueues
//! (gate.rs), after waiting for the context. Which chunks move is decided by *hotness*: the
//! pointers in launch arguments, counted per chunk between quiesce points (launch.rs,
//! hotness.rs), given to a pure policy (moves.rs). The moves keep each chunk's address, so
//! nothing the program holds — pointers, captured graphs — goes stale (migrate.rs).
//!
//! # Stage 3: paging within a cycle
//!
//! A training loop touches its whole working set every step, so placing chunks once per step
//! leaves the share beyond the budget on the host. tiermem records each *cycle* — the launches
//! between two synchronizations: kernel handle, chunks touched — and plans the next as the same
//! (cycle.rs): consecutive segments whose working set fits the budget, with the moves before
//! each (segments.rs, pure: bring the segment's chunks up, send down those used furthest ahead).
//! The first segment's moves are made at the synchronization; each later one at a *pause*
//! tiermem makes before the segment's first launch (gate exclusive, context idle, stage 2's
//! moves). A kernel other than the recorded one at an index, or more launches, stops following
//! until the next synchronization. Safe with pointers tiermem never saw: moves happen only with
//! the context idle. On by default (`TIERMEM_SEGMENTS=off` leaves stage 2 alone): with chunks
//! of 32 MiB (process.rs) its pauses cost less than they save (docs/transparent.md).
//!
//! ```text
//!  dlsym · cuGetProcAddress(_v2)   routes.rs: real pointer → wrapper
//!        │
//!  cuMemAlloc_v2, cuMemFree_v2 …   entry.rs: what tiermem serves, what goes to the driver
//!  cuLaunchKernel …                launch.rs: pause (cycle.rs) + gate + argument scan → hotness.rs, cycle.rs
//!  cuGraphLaunch · captures        graphs.rs: a graph's captured pointers, counted at each replay
//!  cuMemcpy* · cuMemset* · sync    gated.rs (wrappers.rs writes them): gate, quiesce points
//!        │
//!  process.rs                      GPUs, budget, allocations.rs (books), stats.rs, peers.rs (two GPUs)
//!  ipc.rs · pointers.rs            legacy IPC handles, what a pointer says of its allocation
//!  reset.rs                        cudaDeviceReset: frees tiermem's memory of the GPU, closes it
//!  contexts.rs                     the program's own contexts: waited for by migrations, their memory freed with them
//!  deferred.rs                     async frees: stream-ordered, kept mapped for reuse (reuse_order.rs: where)
//!        │                 └──── placement.rs (pure: HBM or host at allocation)
//!  migrate.rs                      at a quiesce point: moves.rs (pure: what moves), then maps, copies, remaps;
//!                                  at a pause: a segment's moves (segments.rs, pure: cut and Belady);
//!                                  verify.rs checks each move's bytes when asked (TIERMEM_VERIFY_MOVES)
//!        │
//!  tiermem-mechanism (CudaDevice)  reserve, create, map, set access, copy
//!  driver.rs                       the real dlsym, libcuda, the driver's own entry points
//! ```
//!
//! Nothing here unwinds into the program (boundary.rs); a failure inside tiermem prints one
//! line, `tiermem: <call>: <what failed>; <what to do>`, and returns a CUDA error code.

mod allocations;
mod boundary;
mod captures;
mod contexts;
mod cycle;
mod deferred;
mod driver;
mod entry;
mod gate;
mod gated;
mod give_back;
mod gpu_flags;
mod graphs;
mod hotness;
mod ipc;
mod ipc_wire;
mod launch;
mod lease;
mod migrate;
mod moves;
mod nvml;
mod peers;
mod placement;
mod pointers;
mod pool_stats;
mod pools;
mod process;
mod remap;
mod reset;
mod reuse_order;
mod rounds;
mod routes;
mod segments;
mod shadows;
mod spares;
mod spill;
mod stats;
mod torch_alloc;
mod torch_stats;
mod trace;
mod trial;
mod turns;
mod verify;
mod vmm;
mod wrappers;

pub use entry::{
    cuMemAllocAsync, cuMemAllocAsync_ptsz, cuMemAllocManaged, cuMemAllocPitch_v2, cuMemAlloc_v2, cuMemFreeAsync,
    cuMemFreeAsync_ptsz, cuMemFree_v2, cuMemGetInfo_v2,
};
pub use ipc::{cuIpcCloseMemHandle, cuIpcGetMemHandle, cuIpcOpenMemHandle, cuIpcOpenMemHandle_v2};
pub use nvml::{nvmlDeviceGetMemoryInfo, nvmlDeviceGetMemoryInfo_v2};
pub use pointers::{cuMemGetAddressRange_v2, cuMemRetainAllocationHandle, cuPointerGetAttribute};
pub use pools::{cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz, cuMemPoolTrimTo};
pub use routes::{cuGetProcAddress, cuGetProcAddress_v2, dlsym};
pub use vmm::{cuMemCreate, cuMemRelease};

/// At exit: prints the statistics when `TIERMEM_STATS` is set (`tiermem run --stats`), and
/// writes them as JSON to `TIERMEM_STATS_JSON` when that is set (`tiermem bench transparent`).
extern "C" fn report_stats() {
    let _ = std::panic::catch_unwind(|| {
        if !reports() {
            return;
        }
        let (stats, migration) = (process::stats(), migrate::counters());
        if stats_wanted() {
            eprintln!("{}\n{}", stats.report(), migration.report());
            for line in lease::report()
                .into_iter()
                .chain(ipc::report())
                .chain(deferred::report())
                .chain(vmm::report())
                .chain(spill::report())
                .chain(captures::report())
                .chain(graphs::report())
                .chain(spares::report())
                .chain(cycle::trial_report())
                .chain(verify::report())
            {
                eprintln!("{line}");
            }
        }
        if let Some(path) = std::env::var_os("TIERMEM_STATS_JSON").filter(|p| !p.is_empty()) {
            if let Err(why) = std::fs::write(&path, migration.json(&stats, spill::peak_bytes())) {
                boundary::log(
                    "TIERMEM_STATS_JSON",
                    &format!("{} could not be written ({why})", path.to_string_lossy()),
                    "no JSON stats",
                );
            }
        }
    });
}

/// Whether this process reports at exit: the command `tiermem run` started (exec keeps the
/// pid it names in `TIERMEM_RUN_PID`) or a process that loaded the driver — not every `sed` or
/// `ls` of a shell script run under it, whose zeros would bury the report that counts and could
/// overwrite `TIERMEM_STATS_JSON`.
fn reports() -> bool {
    let started = std::env::var("TIERMEM_RUN_PID").ok().and_then(|pid| pid.parse::<u32>().ok());
    if started == Some(std::process::id()) {
        return true;
    }
    // SAFETY: RTLD_NOLOAD only looks a loaded library up by name; a handle it returns is
    // released at once (the program's own reference keeps the library loaded).
    unsafe {
        let handle = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        if handle.is_null() {
            return false;
        }
        libc::dlclose(handle);
    }
    true
}

fn stats_wanted() -> bool {
    std::env::var_os("TIERMEM_STATS").is_some_and(|v| !v.is_empty() && v != "0")
}

/// Runs when the library is loaded: finds glibc's `dlsym` for `RTLD_NEXT` lookups and registers
/// [`report_stats`] if asked for.
extern "C" fn on_load() {
    routes::remember_next_dlsym();
    if stats_wanted() || std::env::var_os("TIERMEM_STATS_JSON").is_some() {
        // SAFETY: registers a function with the C signature atexit expects; it touches only
        // tiermem's counters, stderr and one file, all usable until the process ends.
        unsafe { libc::atexit(report_stats) };
    }
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;
