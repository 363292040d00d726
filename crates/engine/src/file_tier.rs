//! The file tier in the engine: spilling the host tier to the file, and paging in from it.
//!
//! Chunks reach the file only from the host tier: when the host tier is full, its coldest
//! `Host` chunks (chosen by the engine's policy) are written to the file and their host slots
//! freed; a chunk whose bytes the file already holds (`Chunk::file`) is dropped with no
//! write. `page_out_to_file` is a page-out followed by that spill for the target's chunks.
//!
//! A page-in from the file goes through the background reader (file_reads.rs): into a pinned
//! staging area of the reader's own, not into the host tier, and up from there; the call
//! returns once the chunks are mapped and their reads queued. The chunk keeps its file slot:
//! evicting it again, unless it was acquired for writing, writes nothing.
//!
//! A spill by a call that waits with the lock released (`Engine::unlocked_waits`: acquire,
//! write, read, page-in, advance, page-out) runs in the background, as the write of
//! `page_out_to_file_start` does (file_writes.rs); the other calls spill in the calling
//! thread, under the lock. Either way io_uring or a thread pool keeps many slots in flight.

use crate::file_reads::FileReader;
use crate::{EngineConfig, Error, Result};
use std::sync::Arc;
use tiermem_mechanism::file_store::{FileStore, FileStoreConfig};
use tiermem_mechanism::Device;

pub(crate) struct FileTier {
    /// Shared with background writes (file_writes.rs) and the reader.
    pub store: Arc<FileStore>,
    pub reader: FileReader,
}

impl FileTier {
    /// Creates the file tier's store (one slot per chunk) and its background reader.
    pub fn open(device: &Arc<dyn Device>, config: &EngineConfig, path: &std::path::Path, chunk: usize) -> Result<Self> {
        let store = FileStore::open(FileStoreConfig {
            path: path.to_owned(),
            capacity: config.file_limit / chunk * chunk,
            slot_size: chunk,
            queue_depth: config.file_queue_depth.max(1),
            io: config.file_io,
        })
        .map_err(|source| Error::File { call: "Engine::new", source })?;
        let store = Arc::new(store);
        let group_chunks = crate::file_reads::GROUP_BATCHES * config.batch_chunks.max(1);
        let reader = FileReader::start(Arc::clone(device), Arc::clone(&store), group_chunks)?;
        Ok(FileTier { store, reader })
    }
}
