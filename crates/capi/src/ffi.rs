//! The general C entry points (`include/tiermem.h`): create the process-wide engine,
//! allocate, acquire and release ranges by device pointer, copy bytes from and to the host,
//! move buffers between tiers.
//!
//! Every function returns a [`TiermemStatus`] and, on failure, leaves a message naming the
//! function for `tiermem_last_error()`. None unwinds into C. Pointers the caller passes are
//! checked for null; beyond that they must be valid for the sizes given, as in `memcpy`.
//! Every function may be called from any thread.

use crate::process;
use crate::status::{entry, Failure, TiermemStatus};
use std::ffi::{c_char, c_void, CStr};
use tiermem::{Access, AllocOptions, Engine, EngineConfig, StreamHandle, Target};

/// Settings of `tiermem_init`. Start from `tiermem_config_default()`: a NULL string, a zero
/// size or a negative device keeps the matching `TIERMEM_*` environment variable (or its
/// default). Strings use the variables' syntax ("sim", "lru"); sizes are in bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TiermemConfig {
    /// "auto", "cuda" or "sim" (TIERMEM_BACKEND).
    pub backend: *const c_char,
    /// GPU ordinal (TIERMEM_DEVICE); negative: keep.
    pub device: i32,
    /// Bytes of HBM the engine may hold (TIERMEM_HBM_LIMIT); 0: keep.
    pub hbm_limit: usize,
    /// Bytes of pinned host memory for the host tier (TIERMEM_HOST_LIMIT); 0: keep.
    pub host_limit: usize,
    /// "lru", "lru-cost", "priority", "random" or "belady" (TIERMEM_POLICY).
    pub policy: *const c_char,
    /// Size of the simulated device in bytes (TIERMEM_SIM_HBM); 0: keep.
    pub sim_hbm: usize,
    /// Path of the file tier (TIERMEM_FILE).
    pub file: *const c_char,
    /// Bytes of the file tier (TIERMEM_FILE_LIMIT); 0: keep.
    pub file_limit: usize,
}

/// Options of `tiermem_alloc`; NULL means all defaults.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TiermemAllocOptions {
    /// Shown in statistics; may be NULL.
    pub name: *const c_char,
    /// Larger is more important: the "priority" policy evicts lower priorities first.
    pub priority: i32,
    /// Written once with `tiermem_write`, then only acquired for reading (model weights).
    pub read_only: bool,
    /// Reads (`write` false) may be served where its chunks lie in a neighbour GPU's HBM,
    /// over NVLink, instead of bringing them in (with `TIERMEM_PEER_IN_PLACE=on`).
    pub in_place: bool,
}

/// A configuration that keeps every environment variable.
#[no_mangle]
pub extern "C" fn tiermem_config_default() -> TiermemConfig {
    TiermemConfig {
        backend: std::ptr::null(),
        device: -1,
        hbm_limit: 0,
        host_limit: 0,
        policy: std::ptr::null(),
        sim_hbm: 0,
        file: std::ptr::null(),
        file_limit: 0,
    }
}

/// A C string argument, or `None` for NULL.
///
/// # Safety
/// `text` is NULL or points at a NUL-terminated string alive for the call.
unsafe fn optional_str<'a>(field: &str, text: *const c_char) -> Result<Option<&'a str>, Failure> {
    if text.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null, and the caller promises a NUL-terminated string alive for the call.
    let text = unsafe { CStr::from_ptr(text) };
    text.to_str().map(Some).map_err(|_| Failure::invalid(format!("{field} is not UTF-8")))
}

fn invalid(field: &str, error: impl std::fmt::Display) -> Failure {
    Failure::invalid(format!("{field}: {error}"))
}

/// The engine configuration: the environment, overridden by the fields that are set.
///
/// # Safety
/// The string fields are NULL or NUL-terminated strings alive for the call.
unsafe fn config_from(c: &TiermemConfig) -> Result<EngineConfig, Failure> {
    let mut config = EngineConfig::from_env()?;
    // SAFETY: the caller promises the strings are NULL or valid NUL-terminated strings.
    if let Some(backend) = unsafe { optional_str("backend", c.backend)? } {
        config.backend = backend.parse().map_err(|e| invalid("backend", e))?;
    }
    // SAFETY: as above.
    if let Some(policy) = unsafe { optional_str("policy", c.policy)? } {
        config.policy = policy.parse().map_err(|e| invalid("policy", e))?;
    }
    // SAFETY: as above.
    if let Some(file) = unsafe { optional_str("file", c.file)? } {
        config.file = Some(file.into());
    }
    if let Ok(device) = usize::try_from(c.device) {
        config.device = device;
    }
    let given = |bytes: usize| (bytes > 0).then_some(bytes);
    config.hbm_limit = given(c.hbm_limit).or(config.hbm_limit);
    config.host_limit = given(c.host_limit).or(config.host_limit);
    config.sim_hbm = given(c.sim_hbm).unwrap_or(config.sim_hbm);
    config.file_limit = given(c.file_limit).unwrap_or(config.file_limit);
    Ok(config)
}

/// Creates the process-wide engine from `config` (NULL: from the `TIERMEM_*` variables alone).
/// Without a GPU, `backend` "auto" falls back to the simulated device.
///
/// # Safety
/// `config` is NULL or points at a `TiermemConfig` whose strings are NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn tiermem_init(config: *const TiermemConfig) -> TiermemStatus {
    entry("tiermem_init", || {
        // SAFETY: the caller promises `config` is NULL or valid, with valid strings.
        let config = match unsafe { config.as_ref() } {
            None => EngineConfig::from_env()?,
            // SAFETY: as above.
            Some(c) => unsafe { config_from(c)? },
        };
        process::init(config).map(drop)
    })
}

/// Drops the process-wide engine; refused while allocations are live.
#[no_mangle]
pub extern "C" fn tiermem_shutdown() -> TiermemStatus {
    entry("tiermem_shutdown", process::shutdown)
}

/// Allocates `size` bytes at a device address that never changes; writes it to `*out_ptr`.
/// Never-written bytes read as zeros. The memory is not resident until acquired.
///
/// # Safety
/// `options` is NULL or valid (its `name` NULL or NUL-terminated); `out_ptr` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tiermem_alloc(
    size: usize,
    options: *const TiermemAllocOptions,
    out_ptr: *mut u64,
) -> TiermemStatus {
    entry("tiermem_alloc", || {
        if out_ptr.is_null() {
            return Err(Failure::invalid("out_ptr is NULL: pass where to store the device pointer"));
        }
        // SAFETY: the caller promises `options` is NULL or valid.
        let options = match unsafe { options.as_ref() } {
            None => AllocOptions::default(),
            Some(o) => AllocOptions {
                priority: o.priority,
                read_only: o.read_only,
                in_place: o.in_place,
                // SAFETY: the caller promises `name` is NULL or NUL-terminated.
                name: unsafe { optional_str("name", o.name)? }.map(str::to_owned),
            },
        };
        let ptr = process::alloc(size, options, None)?;
        // SAFETY: checked non-null; the caller promises it is valid for a write.
        unsafe { out_ptr.write(ptr) };
        Ok(())
    })
}

/// Frees the allocation `ptr` (as `tiermem_alloc` returned it); it must not be acquired.
#[no_mangle]
pub extern "C" fn tiermem_free(ptr: u64) -> TiermemStatus {
    entry("tiermem_free", || process::free(ptr, false, StreamHandle(0)))
}

/// Makes `[ptr, ptr + len)` (inside one allocation) resident until released; work queued on
/// `stream` (a CUstream; NULL: the legacy stream) afterwards sees it. Never blocks the host
/// when HBM is free; `write` marks the range dirty (refused for read-only allocations).
#[no_mangle]
pub extern "C" fn tiermem_acquire(ptr: u64, len: usize, write: bool, stream: *mut c_void) -> TiermemStatus {
    entry("tiermem_acquire", || {
        let (engine, region) = process::region(ptr, len)?;
        let access = if write { Access::ReadWrite } else { Access::ReadOnly };
        Ok(engine.acquire(&[region], access, StreamHandle(stream as u64))?)
    })
}

/// Ends an acquire of the same range once the work queued on `stream` so far is done.
#[no_mangle]
pub extern "C" fn tiermem_release(ptr: u64, len: usize, stream: *mut c_void) -> TiermemStatus {
    entry("tiermem_release", || {
        let (engine, region) = process::region(ptr, len)?;
        Ok(engine.release(&[region], StreamHandle(stream as u64))?)
    })
}

/// Gives up the bytes of the whole chunks inside `len` bytes at `ptr`, which the program no
/// longer wants: their memory is freed with nothing copied, and the next acquire finds them as
/// zeros without a page-in. Never waits; a chunk it cannot drop at once keeps its bytes, so the
/// range's bytes are undefined until written. The range must not be acquired.
#[no_mangle]
pub extern "C" fn tiermem_discard(ptr: u64, len: usize) -> TiermemStatus {
    entry("tiermem_discard", || {
        let (engine, region) = process::region(ptr, len)?;
        engine.discard(&[region])?;
        Ok(())
    })
}

/// Copies `len` bytes from host memory `src` to device memory at `ptr`, wherever it lives.
///
/// # Safety
/// `src` is valid for reads of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn tiermem_write(ptr: u64, src: *const c_void, len: usize) -> TiermemStatus {
    entry("tiermem_write", || {
        if src.is_null() {
            return Err(Failure::invalid("src is NULL: pass the host bytes to write"));
        }
        let (engine, region) = process::region(ptr, len)?;
        // SAFETY: non-null, and the caller promises `len` readable bytes.
        let bytes = unsafe { std::slice::from_raw_parts(src.cast::<u8>(), len) };
        Ok(engine.write(region.buffer, region.offset, bytes)?)
    })
}

/// Copies `len` bytes of device memory at `ptr`, wherever it lives, to host memory `dst`.
///
/// # Safety
/// `dst` is valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn tiermem_read(ptr: u64, dst: *mut c_void, len: usize) -> TiermemStatus {
    entry("tiermem_read", || {
        if dst.is_null() {
            return Err(Failure::invalid("dst is NULL: pass host memory of len bytes"));
        }
        let (engine, region) = process::region(ptr, len)?;
        // SAFETY: non-null, and the caller promises `len` writable bytes.
        let bytes = unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), len) };
        Ok(engine.read(region.buffer, region.offset, bytes)?)
    })
}

/// Runs a page call on the allocation containing `ptr`, or on every buffer for 0.
fn page(call: &'static str, ptr: u64, move_it: fn(&Engine, Target) -> tiermem::Result<()>) -> TiermemStatus {
    entry(call, || {
        let (engine, target) = if ptr == 0 {
            (process::require_engine()?, Target::All)
        } else {
            let found = process::find(ptr)?;
            (found.value.engine, Target::Buffer(found.value.id))
        };
        Ok(move_it(&engine, target)?)
    })
}

/// Pages the allocation containing `ptr` (0: every buffer) out of HBM and waits.
#[no_mangle]
pub extern "C" fn tiermem_page_out(ptr: u64) -> TiermemStatus {
    page("tiermem_page_out", ptr, Engine::page_out)
}

/// Pages the allocation containing `ptr` (0: every buffer) into HBM and waits.
#[no_mangle]
pub extern "C" fn tiermem_page_in(ptr: u64) -> TiermemStatus {
    page("tiermem_page_in", ptr, Engine::page_in)
}

/// Which allocation `ptr` falls in: its start (the pointer `tiermem_alloc` returned) and
/// size. Either output may be NULL.
///
/// # Safety
/// `out_start` and `out_size` are NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tiermem_lookup(ptr: u64, out_start: *mut u64, out_size: *mut usize) -> TiermemStatus {
    entry("tiermem_lookup", || {
        let found = process::find(ptr)?;
        // SAFETY: the caller promises each output is NULL or valid for a write.
        if let Some(start) = unsafe { out_start.as_mut() } {
            *start = found.start;
        }
        // SAFETY: as above.
        if let Some(size) = unsafe { out_size.as_mut() } {
            *size = found.len;
        }
        Ok(())
    })
}

/// The process engine's statistics as JSON (tiers, transfer counters, every buffer), written
/// NUL-terminated to `buf` of `capacity` bytes; `*needed` gets the size needed, NUL included.
/// With `buf` NULL only `*needed` is written (a size query); a `capacity` below it writes
/// nothing else and fails.
///
/// # Safety
/// `buf` is NULL or valid for writes of `capacity` bytes; `needed` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tiermem_stats_json(buf: *mut c_char, capacity: usize, needed: *mut usize) -> TiermemStatus {
    entry("tiermem_stats_json", || {
        if needed.is_null() {
            return Err(Failure::invalid("needed is NULL: pass where to store the size the JSON needs"));
        }
        let json = serde_json::to_string(&process::require_engine()?.stats())
            .map_err(|e| Failure::new(TiermemStatus::Internal, format!("serializing the statistics: {e}")))?;
        // SAFETY: checked non-null; the caller promises it is valid for a write.
        unsafe { needed.write(json.len() + 1) };
        if buf.is_null() {
            return Ok(());
        }
        if capacity <= json.len() {
            return Err(Failure::invalid(format!(
                "a buffer of {capacity} bytes is too small: the statistics need {} (see *needed)",
                json.len() + 1
            )));
        }
        // SAFETY: `buf` is non-null and the caller promises `capacity` writable bytes, which
        // hold the JSON and its NUL (checked just above); the JSON is a Rust string, not `buf`.
        unsafe {
            std::ptr::copy_nonoverlapping(json.as_ptr(), buf.cast::<u8>(), json.len());
            buf.add(json.len()).write(0);
        }
        Ok(())
    })
}

/// Allocations made through this C ABI and not yet freed (PyTorch's included).
#[no_mangle]
pub extern "C" fn tiermem_live_allocations() -> usize {
    std::panic::catch_unwind(process::live_allocations).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_pointers_are_refused_with_a_message() {
        // SAFETY: the pointers passed are null, which the functions accept and refuse.
        let status = unsafe { tiermem_alloc(4096, std::ptr::null(), std::ptr::null_mut()) };
        assert_eq!(status, TiermemStatus::InvalidArgument);
        assert!(crate::status::take_last_error().unwrap().starts_with("tiermem_alloc: out_ptr is NULL"));
        // SAFETY: as above.
        let status = unsafe { tiermem_write(0x1000, std::ptr::null(), 1) };
        assert_eq!(status, TiermemStatus::InvalidArgument);
        assert!(crate::status::take_last_error().unwrap().contains("src is NULL"));
    }

    #[test]
    fn a_config_overrides_only_what_it_sets() {
        let backend = c"sim";
        let c = TiermemConfig { backend: backend.as_ptr(), hbm_limit: 4 << 20, ..tiermem_config_default() };
        // SAFETY: the strings are NULL or the literal above.
        let config = unsafe { config_from(&c) }.unwrap();
        let env = EngineConfig::from_env().unwrap();
        assert_eq!(config.hbm_limit, Some(4 << 20));
        assert_eq!((config.device, config.sim_hbm, config.policy), (env.device, env.sim_hbm, env.policy));
        let bad = TiermemConfig { policy: c"fastest".as_ptr(), ..tiermem_config_default() };
        // SAFETY: as above.
        let failure = unsafe { config_from(&bad) }.unwrap_err();
        assert!(failure.message.starts_with("policy: "), "{failure}");
    }
}
