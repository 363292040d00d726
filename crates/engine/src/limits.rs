//! The caps of the tiers, checked against the machine before anything is allocated.
//!
//! A cap is a promise the engine will try to keep, so a cap the machine can never honour is a
//! mistake to report at once, not something to find out by filling the machine: a typo such
//! as `TIERMEM_HBM_LIMIT=100TiB` once made the simulated device try to take 100 TiB of host
//! memory and sent the machine into swap. The rules:
//!
//! * **HBM**: more than the device has in all is an error. More than is free now is allowed
//!   (others may free memory); the pool takes what the driver gives and shrinks its cap when
//!   the driver runs out (chunk_pool.rs).
//! * **Host**: pinned memory cannot be swapped out, so more than the host has in all is an
//!   error, and more than is available now is cut to what is available, with a warning.
//! * **File**: more than the file system has free (plus what the file already holds, if it
//!   exists) is an error: the file is preallocated in full.
//!
//! The simulated device checks its own size against host memory (`SimDevice::new`).

use crate::{format_size, EngineConfig, Error, Result};
use tiermem_mechanism::{BackendKind, DeviceInfo, HostMemory};

/// The caps an engine runs with, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Caps {
    pub hbm: usize,
    pub host: usize,
}

/// The HBM and host caps `config` gives on `device` with `free` bytes of it free, or the
/// error that says which setting is beyond the machine.
pub(crate) fn caps(config: &EngineConfig, device: &DeviceInfo, free: usize) -> Result<Caps> {
    let chunk = device.granularity;
    let hbm = config.hbm_cap(device.backend, free);
    if hbm > device.total_bytes {
        return Err(Error::Config(format!(
            "TIERMEM_HBM_LIMIT (hbm_limit) of {} is more than {} has in all ({}); set it to at most that",
            format_size(hbm),
            device.name,
            format_size(device.total_bytes)
        )));
    }
    if hbm > free && device.backend == BackendKind::Cuda {
        eprintln!(
            "tiermem: warning: the HBM cap of {} is more than the {} free on {} now; the cap shrinks to what the driver gives",
            format_size(hbm),
            format_size(free),
            device.name
        );
    }
    if hbm < chunk {
        return Err(Error::Config(format!(
            "HBM cap of {hbm} bytes is less than one {chunk}-byte chunk (free on the device: {free})"
        )));
    }
    let host = host_cap(config.host_limit, HostMemory::read())?;
    if host < chunk {
        return Err(Error::Config(format!("host cap of {host} bytes is less than one {chunk}-byte chunk")));
    }
    Ok(Caps { hbm, host })
}

/// The host cap: the explicit limit (an error above the host's total memory, cut to what is
/// available above that), else half of what is available (8 GiB if that cannot be read).
fn host_cap(limit: Option<usize>, memory: Option<HostMemory>) -> Result<usize> {
    let Some(HostMemory { total, available }) = memory else { return Ok(limit.unwrap_or(8 << 30)) };
    let Some(limit) = limit else { return Ok(available / 2) };
    if limit > total {
        return Err(Error::Config(format!(
            "TIERMEM_HOST_LIMIT (host_limit) of {} is more than this host's {} of memory; pinned memory cannot be swapped, so set it well below that",
            format_size(limit),
            format_size(total)
        )));
    }
    if limit > available {
        eprintln!(
            "tiermem: warning: TIERMEM_HOST_LIMIT (host_limit) of {} is more than the {} of host memory available now; using {}",
            format_size(limit),
            format_size(available),
            format_size(available)
        );
        return Ok(available);
    }
    Ok(limit)
}

/// Refuses a file tier larger than its file system can hold.
pub(crate) fn check_file(path: &std::path::Path, limit: usize) -> Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => std::path::Path::new("."),
    };
    let Some(free) = free_space(dir) else { return Ok(()) }; // FileStore::open reports what is wrong
    let existing = std::fs::metadata(path).map_or(0, |m| m.len() as usize);
    if limit > free + existing {
        return Err(Error::Config(format!(
            "TIERMEM_FILE_LIMIT (file_limit) of {} is more than the {} free on the file system of {}; set it lower or put TIERMEM_FILE elsewhere",
            format_size(limit),
            format_size(free + existing),
            path.display()
        )));
    }
    Ok(())
}

/// Bytes an unprivileged user may still write on the file system of `dir`.
fn free_space(dir: &std::path::Path) -> Option<usize> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs fills the zeroed struct we own from a NUL-terminated path; no other memory.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return None;
    }
    Some((stat.f_bavail as usize).saturating_mul(stat.f_frsize as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: usize = 1 << 30;

    #[test]
    fn a_host_cap_beyond_the_host_is_refused_and_beyond_what_is_available_is_cut() {
        let memory = Some(HostMemory { total: 64 * GIB, available: 32 * GIB });
        let e = host_cap(Some(100 << 40), memory).unwrap_err().to_string();
        assert!(e.contains("TIERMEM_HOST_LIMIT") && e.contains("100.00 TiB") && e.contains("64.00 GiB"), "{e}");
        assert_eq!(host_cap(Some(40 * GIB), memory).unwrap(), 32 * GIB);
        assert_eq!(host_cap(Some(8 * GIB), memory).unwrap(), 8 * GIB);
        assert_eq!(host_cap(None, memory).unwrap(), 16 * GIB);
        assert_eq!(host_cap(None, None).unwrap(), 8 * GIB);
    }

    #[test]
    fn a_file_tier_beyond_its_file_system_is_refused() {
        let path = std::env::temp_dir().join(format!("tiermem-limits-{}", std::process::id()));
        let e = check_file(&path, usize::MAX / 2).unwrap_err().to_string();
        assert!(e.contains("TIERMEM_FILE_LIMIT") && e.contains("free on the file system"), "{e}");
        check_file(&path, 1 << 20).unwrap();
        assert!(!path.exists(), "checking creates nothing");
    }
}
