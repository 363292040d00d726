//! Slabs lent by another process: a lender (`tiermem lend`, through the node daemon) exports a
//! slab of its GPU's HBM as a file descriptor; this engine imports it
//! (`cuMemImportFromShareableHandle`), maps it into a range of its own and uses its slots as
//! it uses slabs it made. The engine neither makes nor caps such slabs: the daemon decides
//! how many it holds, and asks for them back by id. Giving one back is the same drain as for a
//! slab of its own (its chunks move out, then one unmap and one release); the memory returns
//! to the lender once the lender releases its handle too.
//!
//! A GPU that lends only this way is a lender with a cap of nothing: nothing is ever made
//! there, the lender watch's caps leave its lent slabs alone, and its traffic is never held
//! (its budget bucket is not made: lenders added after the engine started are not watched for
//! busyness).

use super::{Lender, PeerSlot, PeerTier, Slab};
use std::os::fd::BorrowedFd;
use tiermem_mechanism::{Device, DeviceError, Result};

impl PeerTier {
    /// Maps the slab behind `fd` (lent by GPU `gpu`, the daemon's `id`, `bytes` long) as a slab
    /// of this tier. On failure nothing is kept: the caller returns the slab to the daemon.
    pub fn adopt(&mut self, device: &dyn Device, gpu: usize, id: u64, fd: BorrowedFd<'_>, bytes: usize) -> Result<()> {
        if bytes != self.slab_bytes() {
            return Err(DeviceError::Unsupported(format!(
                "lent slab {id} of GPU {gpu} is {bytes} bytes; this engine maps slabs of {}",
                self.slab_bytes()
            )));
        }
        if self.live().any(|s| s.lent == Some(id)) {
            return Err(DeviceError::Unsupported(format!("lent slab {id} is mapped here already")));
        }
        let handle = device.import_chunk(fd, bytes)?;
        let va = match device.reserve(bytes) {
            Ok(va) => va,
            Err(e) => {
                let _ = device.release_chunk(handle);
                return Err(e);
            }
        };
        let mapped = device.map_sized(va, handle, bytes).and_then(|()| {
            device.set_access_from(va, bytes, &[self.me]).inspect_err(|_| {
                let _ = device.unmap(va, bytes);
            })
        });
        if let Err(e) = mapped {
            let _ = device.release_chunk(handle);
            let _ = device.unreserve(va, bytes);
            return Err(e);
        }
        let lender = self.lender_index(gpu);
        let index = self.slabs.len();
        self.slabs.push(Some(Slab { lender, lent: Some(id), va, handles: vec![handle], used: 0, draining: false }));
        let base = (index * self.slab_chunks) as u32;
        self.free.extend((base..base + self.slab_chunks as u32).map(PeerSlot));
        Ok(())
    }

    /// Starts giving back the lent slabs `ids` (those not mapped here are ignored): their free
    /// slots are handed out no more, and the engine's reclaim moves their chunks out.
    pub fn give_back_lent(&mut self, ids: &[u64]) {
        for index in 0..self.slabs.len() {
            let Some(slab) = self.slabs[index].as_mut() else { continue };
            if slab.lent.is_some_and(|id| ids.contains(&id)) && !slab.draining {
                slab.draining = true;
                let base = (index * self.slab_chunks) as u32;
                for s in base..base + self.slab_chunks as u32 {
                    self.free.remove(&PeerSlot(s));
                }
            }
        }
    }

    /// The lent slabs given back (unmapped and released) since the last call.
    pub fn take_returned_lent(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.returned_lent)
    }

    /// Ids of the lent slabs mapped here now.
    pub fn lent_ids(&self) -> Vec<u64> {
        self.live().filter_map(|s| s.lent).collect()
    }

    /// The index of GPU `gpu` among the lenders, added (lending nothing of its own) if new.
    fn lender_index(&mut self, gpu: usize) -> usize {
        if let Some(i) = self.lenders.iter().position(|l| l.gpu == gpu) {
            return i;
        }
        self.lenders.push(Lender { gpu, cap_slabs: 0, live_slabs: 0, refused: None, most: 0, offered: 0 });
        self.lenders.len() - 1
    }
}
