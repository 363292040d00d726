//! Loop devices over files on the local disk, with direct I/O: the disk device that fio
//! measures, and swap on a file system that refuses swap files.

use super::command::must;
use super::{read_trim, warn_if_failed};
use std::path::Path;
use std::time::Duration;

/// A loop device over a file, with direct I/O (so the file's pages are not cached in RAM as
/// well); detached on drop.
pub struct Loop {
    pub device: String,
    /// Whether the kernel really does direct I/O on it (/sys/block/loopN/loop/dio).
    pub dio: bool,
}

impl Loop {
    pub fn attach(file: &Path) -> Result<Self, String> {
        let file = file.to_str().ok_or("a loop device's file must have a UTF-8 path")?;
        let limit = Duration::from_secs(30);
        let out = must("losetup", &["--direct-io=on", "--sector-size", "4096", "--show", "-f", file], limit)
            .or_else(|_| must("losetup", &["--direct-io=on", "--show", "-f", file], limit))?;
        let device = out.trim().to_string();
        if !device.starts_with("/dev/loop") {
            return Err(format!("losetup printed {device:?}, not a loop device"));
        }
        let name = device.trim_start_matches("/dev/");
        let dio = read_trim(format!("/sys/block/{name}/loop/dio")).as_deref() == Some("1");
        Ok(Loop { device, dio })
    }
}

/// `losetup -d DEVICE`.
pub fn detach(device: &str) -> Result<String, String> {
    must("losetup", &["-d", device], Duration::from_secs(60))
}

impl Drop for Loop {
    fn drop(&mut self) {
        warn_if_failed(detach(&self.device));
    }
}
