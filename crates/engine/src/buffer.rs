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
    /// GPU's HBM over NVLink, instead of coming into this GPU's HBM (in_place.rs says when).
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
