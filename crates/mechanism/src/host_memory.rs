//! How much memory this host has, as `/proc/meminfo` tells it.

/// Host memory in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostMemory {
    pub total: usize,
    /// What the kernel estimates can be allocated now without swapping (`MemAvailable`).
    pub available: usize,
}

impl HostMemory {
    /// `None` where `/proc/meminfo` cannot be read or lacks the fields.
    pub fn read() -> Option<Self> {
        let text = std::fs::read_to_string("/proc/meminfo").ok()?;
        let field = |name: &str| -> Option<usize> {
            let line = text.lines().find(|l| l.starts_with(name))?;
            line.split_whitespace().nth(1)?.parse::<usize>().ok().map(|kib| kib * 1024)
        };
        Some(Self { total: field("MemTotal:")?, available: field("MemAvailable:")? })
    }
}
