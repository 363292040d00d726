//! A flag per GPU of the process (ordinals below 64; a flag of a higher one is never set), read
//! with one atomic load: what the daemon last told each GPU's tenant (turns.rs, spares.rs).

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

pub struct GpuFlags(AtomicU64);

impl GpuFlags {
    pub const fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    /// Sets GPU `ordinal`'s flag to `on`; whether it was set before.
    pub fn set(&self, ordinal: usize, on: bool) -> bool {
        let bit = Self::bit(ordinal);
        let before = match on {
            true => self.0.fetch_or(bit, SeqCst),
            false => self.0.fetch_and(!bit, SeqCst),
        };
        before & bit != 0
    }

    pub fn is_set(&self, ordinal: usize) -> bool {
        self.0.load(SeqCst) & Self::bit(ordinal) != 0
    }

    /// Whether any GPU's flag is set.
    pub fn any(&self) -> bool {
        self.0.load(SeqCst) != 0
    }

    fn bit(ordinal: usize) -> u64 {
        u32::try_from(ordinal).ok().and_then(|o| 1u64.checked_shl(o)).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::GpuFlags;

    #[test]
    fn each_gpu_has_its_own_flag_and_ordinals_beyond_63_none() {
        let flags = GpuFlags::new();
        assert!(!flags.any());
        assert!(!flags.set(3, true), "unset before");
        assert!(flags.set(3, true), "set before");
        assert!(flags.is_set(3) && !flags.is_set(2) && flags.any());
        assert!(!flags.set(64, true) && !flags.is_set(64), "no flag beyond 63");
        assert!(flags.set(3, false));
        assert!(!flags.any());
    }
}
