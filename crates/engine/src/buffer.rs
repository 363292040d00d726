/// Identifies a buffer for its whole life; never reused within one engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufferId(pub u64);

impl std::fmt::Display for BufferId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Options of [`crate::Engine::alloc`].
#[derive(Debug, Clone, Default)]
pub struct AllocOptions {
    /// Larger is more important: the `priority` policy evicts lower priorities first.
    pub priority: i32,
    /// The buffer is written once (with [`crate::Engine::write`]) and then only read, like
    /// model weights: `ReadWrite` acquires are refused, so its host copy stays valid and every
    /// later eviction is an unmap, never a copy (the Bakita paper's read-only buffers).
    pub read_only: bool,
    /// `ReadOnly` acquires of it are [`Access::InPlaceOk`]: its chunks may be read where they
    /// lie in a neighbour GPU's HBM (model weights streamed over NVLink).
    pub in_place: bool,
    /// Shown in statistics.
    pub name: Option<String>,
}

/// How the device will use acquired bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Only read: chunks stay clean and keep their host copy.
    ReadOnly,
    /// Read and written: chunks become dirty and must be copied down when evicted.
    ReadWrite,
    /// Only read, and chunks held by the peer tier may be read where they lie, in a neighbour
    /// GPU's HBM over NVLink, instead of coming into this GPU's HBM (movement.rs, "Reading in place", says when).
    InPlaceOk,
}

/// Bytes of one buffer: the whole buffer, or `len` bytes from `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    pub buffer: BufferId,
    pub offset: usize,
    /// `None`: to the end of the buffer.
    pub len: Option<usize>,
}

impl Region {
    pub fn whole(buffer: BufferId) -> Self {
        Self { buffer, offset: 0, len: None }
    }

    pub fn bytes(buffer: BufferId, offset: usize, len: usize) -> Self {
        Self { buffer, offset, len: Some(len) }
    }
}

impl From<BufferId> for Region {
    fn from(buffer: BufferId) -> Self {
        Region::whole(buffer)
    }
}

/// Splits `len` bytes at `offset` into windows that each lie within one `span`-aligned span
/// (one window when the range does, or is empty), in order.
pub(crate) fn windows(offset: usize, len: usize, span: usize) -> Vec<(usize, usize)> {
    let mut windows = Vec::new();
    let (mut at, end) = (offset, offset.saturating_add(len));
    loop {
        let stop = end.min((at / span + 1).saturating_mul(span));
        windows.push((at, stop - at));
        if stop >= end {
            return windows;
        }
        at = stop;
    }
}

#[cfg(test)]
mod tests {
    use super::windows;
    use proptest::prelude::*;

    #[test]
    fn a_range_within_one_span_is_one_window() {
        assert_eq!(windows(0, 8, 8), vec![(0, 8)]);
        assert_eq!(windows(3, 0, 8), vec![(3, 0)]);
        assert_eq!(windows(6, 12, 8), vec![(6, 2), (8, 8), (16, 2)]);
    }

    proptest! {
        #[test]
        fn windows_cover_the_range_in_order_each_within_a_span(
            offset in 0usize..1000, len in 0usize..1000, span in 1usize..100
        ) {
            let pieces = windows(offset, len, span);
            let mut at = offset;
            for &(start, n) in &pieces {
                prop_assert_eq!(start, at);
                prop_assert!(n > 0 || len == 0);
                prop_assert!(n == 0 || start / span == (start + n - 1) / span);
                at += n;
            }
            prop_assert_eq!(at, offset + len);
        }
    }
}
