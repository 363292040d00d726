//! The engine's side of HBM lent by other processes (peer_lent.rs has the slabs): the tenant
//! link hands it the file descriptors the node daemon passed on, and gives slabs back when
//! the daemon asks (docs/daemon.md, "Borrowing neighbours' HBM").

use crate::{Engine, Error, Result};
use std::os::fd::BorrowedFd;

impl Engine {
    /// Bytes of one slab of the peer tier: slabs lent to this engine must be this size.
    pub fn peer_slab_bytes(&self) -> usize {
        self.lock().tiers.peer.slab_bytes()
    }

    /// Maps slabs of GPU `gpu`'s HBM that another process exported (`id`, descriptor), each
    /// `slab_bytes` long, into the peer tier: chunks leaving HBM may go there from now on.
    /// Returns the slabs that could not be mapped, each with why (nothing of them is kept: give
    /// them back to the lender). The descriptors stay the caller's (close them after).
    pub fn adopt_lent_slabs(
        &self,
        gpu: usize,
        slab_bytes: usize,
        slabs: &[(u64, BorrowedFd<'_>)],
    ) -> Vec<(u64, Error)> {
        let me = self.device_info().ordinal;
        let refuse = |why: String| slabs.iter().map(|&(id, _)| (id, Error::Config(why.clone()))).collect();
        if gpu == me || !self.device().peer_access(gpu) {
            return refuse(format!(
                "adopt_lent_slabs: GPU {me} cannot map memory of GPU {gpu} (its own, or no peer access to it)"
            ));
        }
        let failed: Vec<(u64, Error)> = {
            let mut inner = self.lock();
            let device = std::sync::Arc::clone(&inner.tiers.device);
            slabs
                .iter()
                .filter_map(|&(id, fd)| {
                    let adopted = inner.tiers.peer.adopt(device.as_ref(), gpu, id, fd, slab_bytes);
                    adopted.err().map(|e| (id, Error::Device { call: "adopt_lent_slabs", source: e }))
                })
                .collect()
        };
        if failed.len() < slabs.len() {
            if let Err(e) = self.ensure_lender_watch() {
                eprintln!("tiermem: lent slabs are not cleaned in the background: {e}");
            }
        }
        failed
    }

    /// Gives the lent slabs `ids` back: chunks in them move out (dropped where another copy
    /// exists, else copied to the host tier), then each is unmapped and its handle released.
    /// Returns the lent slabs given back by now (these, and any given back since the last
    /// call); a slab holding a chunk acquired in place goes back once it is released
    /// ([`Engine::returned_lent_slabs`] then says so).
    pub fn return_lent_slabs(&self, ids: &[u64]) -> Result<Vec<u64>> {
        let mut inner = self.lock();
        inner.tiers.peer.give_back_lent(ids);
        inner.reclaim_peer("return_lent_slabs")?;
        Ok(inner.tiers.peer.take_returned_lent())
    }

    /// Lent slabs given back since the last call (by a reclaim that finished later).
    pub fn returned_lent_slabs(&self) -> Vec<u64> {
        self.lock().tiers.peer.take_returned_lent()
    }

    /// The ids of the lent slabs mapped now.
    pub fn lent_slabs(&self) -> Vec<u64> {
        self.lock().tiers.peer.lent_ids()
    }
}
