//! `vm.page-cluster` set for the benchmark (`bench swap --page-cluster N`): how many pages
//! (2^N) swap-in reads around the one faulted, in one request. Every device is measured under
//! the same setting; the old value comes back at the end. The marker file holds the old value,
//! so the shell's trap can put it back after a run that died.

use super::{read_trim, write_file, PREFIX};
use std::path::{Path, PathBuf};

const PAGE_CLUSTER: &str = "/proc/sys/vm/page-cluster";

/// `vm.page-cluster` as the benchmark set it; back as it was on drop.
pub struct PageCluster {
    was: String,
    marker: PathBuf,
}

impl PageCluster {
    /// Sets `vm.page-cluster` to `value` (0 to 10; the kernel caps the window it gives).
    pub fn set(dir: &Path, value: u32) -> Result<Self, String> {
        if value > 10 {
            return Err(format!("--page-cluster {value}: at most 10 (2^10 pages per swap-in)"));
        }
        let was = read_trim(PAGE_CLUSTER).ok_or_else(|| format!("cannot read {PAGE_CLUSTER}"))?;
        let marker = dir.join(format!("{PREFIX}page-cluster-was"));
        write_file(&marker, &was)?;
        if let Err(e) = write_file(PAGE_CLUSTER, &value.to_string()) {
            let _ = std::fs::remove_file(&marker);
            return Err(e);
        }
        eprintln!("bench swap: vm.page-cluster {value} for the benchmark (was {was}; back at the end)");
        Ok(PageCluster { was, marker })
    }
}

impl Drop for PageCluster {
    fn drop(&mut self) {
        match write_file(PAGE_CLUSTER, &self.was) {
            Ok(()) => {
                let _ = std::fs::remove_file(&self.marker);
            }
            Err(e) => eprintln!("bench swap: could not put vm.page-cluster back to {}: {e}", self.was),
        }
    }
}
