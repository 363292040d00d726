//! zram (a compressed block device in RAM) of the benchmark's own: a device for fio and a swap
//! to compare with; its module loaded and devices added only where missing, and undone.

use super::command::must;
use super::{leave_marker, read_trim, write_file};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A zram device of our own, reset (and removed, and the module unloaded, where we added them)
/// on drop.
pub struct Zram {
    pub id: u32,
    pub device: String,
    pub algorithm: String,
    hot_added: bool,
    loaded_module: bool,
    marker: PathBuf,
}

impl Zram {
    pub fn create(size: u64, dir: &Path) -> Result<Self, String> {
        let control = Path::new("/sys/class/zram-control");
        let mut loaded_module = false;
        if !control.exists() && !Path::new("/sys/block/zram0").exists() {
            must("modprobe", &["zram", "num_devices=0"], Duration::from_secs(30))
                .or_else(|_| must("modprobe", &["zram"], Duration::from_secs(30)))?;
            loaded_module = true;
        }
        let (id, hot_added) = match read_trim(control.join("hot_add")).and_then(|s| s.parse::<u32>().ok()) {
            Some(id) => (id, true),
            // No hot_add: an existing device that is not in use.
            None => (0..16)
                .find(|i| read_trim(format!("/sys/block/zram{i}/disksize")).as_deref() == Some("0"))
                .map(|i| (i, false))
                .ok_or("no unused zram device and no /sys/class/zram-control/hot_add")?,
        };
        let marker = leave_marker(dir, &format!("zram-{id}"));
        let mut zram =
            Zram { id, device: format!("/dev/zram{id}"), algorithm: String::new(), hot_added, loaded_module, marker };
        let sys = format!("/sys/block/zram{id}");
        write_file(format!("{sys}/disksize"), &size.to_string())?;
        zram.algorithm = read_trim(format!("{sys}/comp_algorithm"))
            .and_then(|s| s.split_whitespace().find(|a| a.starts_with('[')).map(|a| a.trim_matches(['[', ']']).into()))
            .unwrap_or_default();
        let until = Instant::now() + Duration::from_secs(5);
        while !Path::new(&zram.device).exists() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(zram)
    }
}

impl Drop for Zram {
    fn drop(&mut self) {
        let sys = format!("/sys/block/zram{}", self.id);
        let mut result = write_file(format!("{sys}/reset"), "1");
        if result.is_ok() && self.hot_added {
            result = write_file("/sys/class/zram-control/hot_remove", &self.id.to_string());
        }
        if result.is_ok() && self.loaded_module {
            result = must("modprobe", &["-r", "zram"], Duration::from_secs(30)).map(drop);
        }
        match result {
            Ok(()) => {
                let _ = std::fs::remove_file(&self.marker);
            }
            Err(e) => eprintln!("bench swap: undoing zram{}: {e}", self.id),
        }
    }
}
