//! zswap (a compressed cache in RAM in front of every swap device) off for the benchmark, so
//! that the devices themselves are measured; back on at the end.

use super::{leave_marker, read_trim, write_file};
use std::path::{Path, PathBuf};

/// Whether zswap is on (`Y`), in sysfs.
pub const ZSWAP: &str = "/sys/module/zswap/parameters/enabled";

/// zswap turned off by the benchmark; back as it was on drop.
pub struct ZswapOff {
    marker: PathBuf,
}

impl ZswapOff {
    /// `Ok(None)` where zswap is absent or already off.
    pub fn take(dir: &Path) -> Result<Option<Self>, String> {
        match read_trim(ZSWAP).as_deref() {
            Some("Y") | Some("1") => {
                let marker = leave_marker(dir, "zswap-was-on");
                write_file(ZSWAP, "N")?;
                eprintln!("bench swap: zswap off for the benchmark (back on at the end)");
                Ok(Some(ZswapOff { marker }))
            }
            _ => Ok(None),
        }
    }
}

impl Drop for ZswapOff {
    fn drop(&mut self) {
        if let Err(e) = write_file(ZSWAP, "Y") {
            eprintln!("bench swap: could not turn zswap back on: {e}");
        }
        let _ = std::fs::remove_file(&self.marker);
    }
}
