//! Pinned host memory, had quickly.
//!
//! `cuMemHostAlloc` pins 2.7 GB/s on the H100 machine: one thread faults in and zeroes 4 KiB
//! pages, then pins them. That is the first-touch cost of every host-tier slab, paid while
//! the engine waits for room to evict into — 0.37 s per GiB, which is what slowed a tenant
//! giving HBM back under the node daemon. Memory mapped here instead: anonymous, aligned to
//! 2 MiB and advised to use transparent huge pages, faulted in by several threads at once (the
//! kernel zeroes each huge page in the thread that touches it), then registered with
//! `cuMemHostRegister` (`PORTABLE`: pinned for every context, as `cuMemHostAlloc` gave). A
//! probe on the same machine (`scripts/gpu/probes/pin_speed.py`) measured 20 GB/s that way
//! with 8 threads, 4.3 GB/s with one.
//!
//! The range is also marked `MADV_DONTFORK`: a child forked from this process must not share
//! it copy-on-write, or the parent's next write would move its page away from the pinned one
//! the GPU copies into. Where the kernel gives no transparent huge pages to advised memory
//! (`/sys/kernel/mm/transparent_hugepage/enabled` is `never`: registering 4 KiB pages measured
//! slower than `cuMemHostAlloc`), or any step fails, the memory comes from `cuMemHostAlloc` as
//! before. Each allocation remembers which it was, for `free`.
//!
//! Memory pinned *ahead* of need ([`Pace::Gentle`]: the room a tenant of the node daemon keeps to
//! evict into) runs beside the program's own work and that of the node's other tenants, which
//! all start pinning ahead two seconds in. With every page faulted by sixteen threads, a
//! tenant's rounds stalled once a second while a slab was pinned, by 25 ms alone and up to
//! 0.29 s with two other tenants pinning too (H200, `bench tenants`' hog victims, thirtieth
//! session): the CPUs the faulting takes from the programs, most likely, besides the driver's
//! ~20 ms a GiB registering. Such memory is faulted in by two threads at CPU priority nice 10
//! instead: slower, but paced as it is, nobody should wait for it. The next runs (thirty-first
//! session) still showed two slow rounds a tenant at the same moments, ~65 ms each beside two
//! others pinning: the driver's registering, which no pace changes, is now the likelier cause.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::driver::sys;

use super::driver::check;
use crate::{HostPtr, Result};

const HUGE_PAGE: usize = 2 << 20;
/// The most threads that fault in one allocation (on the H200 machine's 16 cores, 1 GiB faults
/// in at 26 GB/s with 8 and 37 GB/s with 16; registering it then runs at 44–52 GB/s, whether in
/// one call or in pieces from several threads: `scripts/gpu/probes/pin_split.py`).
const MOST_THREADS: usize = 16;
/// Each touching thread gets at least this much.
const PER_THREAD: usize = 8 << 20;
/// The threads that fault in memory pinned ahead of need, and their CPU priority (`nice`).
const GENTLE_THREADS: usize = 2;
const GENTLE_NICE: libc::c_int = 10;

/// How much of the machine pinning may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pace {
    /// Someone waits for the memory: as many threads as help.
    Fast,
    /// Pinned ahead of need beside other work: two threads at CPU priority nice 10.
    Gentle,
}

impl Pace {
    fn threads(self) -> usize {
        match self {
            Pace::Fast => MOST_THREADS,
            Pace::Gentle => GENTLE_THREADS,
        }
    }
}

/// How each live pinned allocation was made.
#[derive(Default)]
pub(super) struct PinnedAllocations {
    /// Allocations mapped here and registered: their mapped length.
    registered: Mutex<HashMap<HostPtr, usize>>,
}

impl PinnedAllocations {
    /// `size` bytes of pinned host memory, faulted in at `pace`. The caller has this device's
    /// context current.
    pub fn alloc(&self, size: usize, pace: Pace) -> Result<HostPtr> {
        match huge_pages_advisable().then(|| map_and_register(size, pace)).flatten() {
            Some((ptr, len)) => {
                self.registered.lock().unwrap_or_else(|p| p.into_inner()).insert(ptr, len);
                Ok(ptr)
            }
            None => host_alloc(size),
        }
    }

    /// Frees memory from [`PinnedAllocations::alloc`]. The caller has the context current.
    pub fn free(&self, ptr: HostPtr, size: usize) -> Result<()> {
        let len = self.registered.lock().unwrap_or_else(|p| p.into_inner()).remove(&ptr);
        let Some(len) = len else {
            // SAFETY: the driver rejects pointers it did not allocate.
            let r = unsafe { sys::cuMemFreeHost(ptr as *mut c_void) };
            return check("cuMemFreeHost", r, || format!("ptr=0x{ptr:x} size={size}"));
        };
        // SAFETY: `ptr` was registered by `map_and_register` and is still registered.
        let r = unsafe { sys::cuMemHostUnregister(ptr as *mut c_void) };
        if let Err(e) = check("cuMemHostUnregister", r, || format!("ptr=0x{ptr:x} size={size}")) {
            // Still registered: keep it known, so that a retry unregisters it.
            self.registered.lock().unwrap_or_else(|p| p.into_inner()).insert(ptr, len);
            return Err(e);
        }
        // SAFETY: `[ptr, ptr + len)` is the mapping made by `map_and_register`, now unregistered
        // and forgotten here: nothing uses it any more.
        unsafe { libc::munmap(ptr as *mut c_void, len) };
        Ok(())
    }
}

/// How pinned host memory is had on this machine, in words (for `tiermem info`).
pub fn pinned_memory_way() -> String {
    match huge_pages_advisable() {
        true => format!(
            "huge pages faulted in by up to {MOST_THREADS} threads, then registered (cuMemHostAlloc if that fails)"
        ),
        false => "cuMemHostAlloc (the kernel gives no transparent huge pages to advised memory)".to_string(),
    }
}

/// Whether memory advised `MADV_HUGEPAGE` gets transparent huge pages on this machine.
fn huge_pages_advisable() -> bool {
    static ADVISABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ADVISABLE.get_or_init(|| {
        let setting = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
        thp_advisable(&setting)
    })
}

/// Whether a `transparent_hugepage/enabled` setting ("always [madvise] never") gives huge pages
/// to advised memory.
fn thp_advisable(setting: &str) -> bool {
    setting.contains("[always]") || setting.contains("[madvise]")
}

fn host_alloc(size: usize) -> Result<HostPtr> {
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer; PORTABLE makes the memory pinned for every context.
    let r = unsafe { sys::cuMemHostAlloc(&mut p, size, sys::CU_MEMHOSTALLOC_PORTABLE) };
    check("cuMemHostAlloc", r, || format!("size={size} flags=PORTABLE")).map_err(|e| match e {
        // This is host memory: say so rather than report HBM exhaustion.
        crate::DeviceError::OutOfMemory { call, detail } => crate::DeviceError::Driver {
            call,
            code: "CUDA_ERROR_OUT_OF_MEMORY".to_string(),
            detail: format!("{detail}: pinned host memory exhausted"),
        },
        other => other,
    })?;
    Ok(p as HostPtr)
}

/// Maps `size` bytes (rounded up to huge pages) at a huge-page boundary, faults them in at
/// `pace` and registers them: (address, mapped length), or `None` if a step failed (everything
/// undone).
fn map_and_register(size: usize, pace: Pace) -> Option<(HostPtr, usize)> {
    let len = size.checked_next_multiple_of(HUGE_PAGE).filter(|&len| len > 0)?;
    let base = map_aligned(len)?;
    // SAFETY: `[base, base + len)` is a private anonymous mapping of ours.
    let ok = unsafe {
        libc::madvise(base, len, libc::MADV_HUGEPAGE);
        libc::madvise(base, len, libc::MADV_DONTFORK) == 0
    };
    if ok {
        touch(base as usize, len, pace);
        // SAFETY: the range is mapped, readable and writable, and stays so until `free`.
        let r = unsafe { sys::cuMemHostRegister_v2(base, len, sys::CU_MEMHOSTREGISTER_PORTABLE) };
        if r == sys::CUresult::CUDA_SUCCESS {
            return Some((base as HostPtr, len));
        }
    }
    // SAFETY: our mapping, not registered.
    unsafe { libc::munmap(base, len) };
    None
}

/// `len` bytes of fresh anonymous memory at a huge-page boundary.
fn map_aligned(len: usize) -> Option<*mut c_void> {
    let span = len + HUGE_PAGE;
    // SAFETY: a new private anonymous mapping; no existing memory is touched.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return None;
    }
    let start = raw as usize;
    let aligned = start.next_multiple_of(HUGE_PAGE);
    let (head, tail) = (aligned - start, start + span - (aligned + len));
    // SAFETY: both ranges lie inside the mapping just made and outside `[aligned, aligned + len)`.
    unsafe {
        if head > 0 {
            libc::munmap(raw, head);
        }
        if tail > 0 {
            libc::munmap((aligned + len) as *mut c_void, tail);
        }
    }
    Some(aligned as *mut c_void)
}

/// Faults in every page of `[addr, addr + len)` (writable, ours) by writing a zero to it, on
/// up to `pace`'s threads; gently, on threads of their own at a low priority (the calling
/// thread's priority is left as it was).
fn touch(addr: usize, len: usize, pace: Pace) {
    let page = 4096;
    let threads =
        (len / PER_THREAD).clamp(1, pace.threads()).min(std::thread::available_parallelism().map_or(1, |n| n.get()));
    let part = len.div_ceil(threads).next_multiple_of(page);
    let write = move |from: usize| {
        for at in (from..(from + part).min(addr + len)).step_by(page) {
            // SAFETY: `at` lies in the caller's writable mapping; each byte is written by one thread.
            unsafe { std::ptr::write_volatile(at as *mut u8, 0) };
        }
    };
    let spawned_write = move |from: usize| {
        if pace == Pace::Gentle {
            // SAFETY: a plain system call; a `who` of 0 with PRIO_PROCESS names the calling thread
            // (Linux), one of ours that ends with this part. Failing leaves its priority as it
            // was, which is harmless.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, GENTLE_NICE) };
        }
        write(from);
    };
    // Fast, the calling thread takes the first part; gently, every part has a thread of its own,
    // so that the caller's priority is not lowered.
    let first = usize::from(pace == Pace::Fast);
    std::thread::scope(|scope| {
        for k in first..threads {
            if std::thread::Builder::new().spawn_scoped(scope, move || spawned_write(addr + k * part)).is_err() {
                // No thread to be had: this one does that part too.
                write(addr + k * part);
            }
        }
        if first == 1 {
            write(addr);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_pages_are_advisable_unless_the_kernel_says_never() {
        assert!(thp_advisable("always [madvise] never"));
        assert!(thp_advisable("[always] madvise never"));
        assert!(!thp_advisable("always madvise [never]"));
        assert!(!thp_advisable(""), "no such file: no huge pages");
    }

    #[test]
    fn mappings_are_aligned_to_huge_pages_and_every_page_is_touched_once_by_someone() {
        for (len, pace) in [
            (HUGE_PAGE, Pace::Fast),
            (3 * HUGE_PAGE, Pace::Gentle),
            (40 * HUGE_PAGE, Pace::Fast),
            (40 * HUGE_PAGE, Pace::Gentle),
        ] {
            let base = map_aligned(len).expect("mmap");
            assert_eq!(base as usize % HUGE_PAGE, 0);
            // SAFETY: ours, `len` writable bytes.
            unsafe { std::ptr::write_bytes(base as *mut u8, 0xa5, len) };
            // SAFETY: plain system calls about this thread.
            let priority = || unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
            let before = priority();
            touch(base as usize, len, pace);
            assert_eq!(priority(), before, "the caller's priority is left as it was ({pace:?})");
            // SAFETY: as above.
            let bytes = unsafe { std::slice::from_raw_parts(base as *const u8, len) };
            for (i, &b) in bytes.iter().enumerate() {
                assert_eq!(b, if i % 4096 == 0 { 0 } else { 0xa5 }, "byte {i} of {len}");
            }
            // SAFETY: ours, no longer used.
            unsafe { libc::munmap(base, len) };
        }
    }
}
