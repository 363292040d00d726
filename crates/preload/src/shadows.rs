//! A second mapping for each physical chunk a move has copied into: its *shadow*, at an address
//! of its own, opened to the GPU once and kept as long as the chunk lives.
//!
//! A move copies a chunk's bytes from its address in the program into a new physical chunk,
//! which must be mapped somewhere to be written. Mapping it at a scratch slot, opening it and
//! unmapping it again for every move cost as much as the copy itself (~210 µs per 32 MiB chunk
//! on the H200, the VMM calls costing per mapping). Chunks cycle: the HBM a chunk going down
//! leaves is what the next one coming up lands in, and the host chunk a chunk coming up leaves
//! takes the next one going down. So each physical chunk gets its shadow the first time it is
//! a move's destination and keeps it while it is mapped in the program, spare, and a
//! destination again: in a steady loop no move maps anything but the program's own address.
//!
//! A shadow holds no memory of its own (a mapping of the chunk's). It is undone before the
//! chunk is released (migrate.rs's spares and leftovers, process.rs's frees), so nothing is
//! left mapped or reserved.

use std::collections::BTreeMap;

use tiermem_mechanism::{Device, DeviceError, PhysHandle};

/// Physical chunk → its shadow: `(address, bytes)`.
#[derive(Debug, Default)]
pub struct Shadows {
    by_handle: BTreeMap<u64, (u64, usize)>,
}

impl Shadows {
    pub const fn new() -> Self {
        Self { by_handle: BTreeMap::new() }
    }

    /// The shadow of `handle` (`len` bytes), mapped and opened now if it has none.
    pub fn of(&mut self, device: &dyn Device, handle: PhysHandle, len: usize) -> Result<u64, DeviceError> {
        if let Some(&(va, _)) = self.by_handle.get(&handle.0) {
            return Ok(va);
        }
        let va = device.reserve(len)?;
        let mapped = device.map_sized(va, handle, len);
        if let Err(why) = mapped.and_then(|()| device.set_access(va, len)) {
            let _ = device.unmap(va, len);
            let _ = device.unreserve(va, len);
            return Err(why);
        }
        self.by_handle.insert(handle.0, (va, len));
        Ok(va)
    }

    /// Undoes the shadow of `handle`, if it has one: before the chunk is released.
    pub fn forget(&mut self, device: &dyn Device, handle: PhysHandle) {
        if let Some((va, len)) = self.by_handle.remove(&handle.0) {
            let _ = device.unmap(va, len);
            let _ = device.unreserve(va, len);
        }
    }

    /// Takes the shadows of `handles` out, to undo them ([`undo`]) without the books: the
    /// chunks of a freed allocation, before they are released.
    pub fn take(&mut self, handles: impl IntoIterator<Item = PhysHandle>) -> Taken {
        Taken(handles.into_iter().filter_map(|h| self.by_handle.remove_entry(&h.0)).collect())
    }
}

/// Shadows out of the books with their chunks: physical chunk → `(address, bytes)`.
#[derive(Debug, Default)]
pub struct Taken(Vec<(u64, (u64, usize))>);

/// Undoes shadows taken out by [`Shadows::take`].
pub fn undo(device: &dyn Device, taken: &Taken) {
    for &(_, (va, len)) in &taken.0 {
        let _ = device.unmap(va, len);
        let _ = device.unreserve(va, len);
    }
}
