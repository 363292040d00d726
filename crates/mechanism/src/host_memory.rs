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

    /// Whether pinning `bytes` more leaves the host at least an eighth of its memory available:
    /// the rule for memory pinned ahead of need (an engine's room to evict into, a transparent
    /// program's spare host chunks), which nothing can swap out. Not where `memory` is unknown.
    pub fn pinning_leaves_an_eighth(memory: Option<Self>, bytes: usize) -> bool {
        memory.is_some_and(|m| m.available.saturating_sub(bytes) >= m.total / 8)
    }
}

#[cfg(test)]
mod tests {
    use super::HostMemory;

    #[test]
    fn memory_is_pinned_ahead_only_while_the_host_keeps_an_eighth_available() {
        let host = |available| Some(HostMemory { total: 64 << 30, available });
        assert!(HostMemory::pinning_leaves_an_eighth(host(16 << 30), 1 << 30));
        assert!(HostMemory::pinning_leaves_an_eighth(host(9 << 30), 1 << 30), "8 GiB left: an eighth");
        assert!(!HostMemory::pinning_leaves_an_eighth(host(8 << 30), 1 << 30));
        assert!(!HostMemory::pinning_leaves_an_eighth(host(512 << 20), 1 << 30));
        assert!(!HostMemory::pinning_leaves_an_eighth(None, 1 << 30), "unknown: nothing pinned ahead");
    }
}
