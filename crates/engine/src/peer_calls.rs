//! The engine's public calls about the peer tier: who lends, how much, what is borrowed, and
//! giving it back.

use crate::{Engine, Result};

impl Engine {
    /// The neighbour GPUs lending to the peer tier: (GPU, bytes lent now, bytes borrowed now).
    pub fn peer_lenders(&self) -> Vec<(usize, usize, usize)> {
        let g = self.lock();
        let peer = &g.tiers.peer;
        peer.lenders().iter().map(|l| (l.gpu, peer.cap_of(l), peer.borrowed_from(l.gpu))).collect()
    }

    /// What the lender watch does every 100 ms, now: reads each lender's free memory and how
    /// busy its own kernels keep it, gives back what a lender short of memory needs, and holds
    /// the traffic of busy lenders (`TIERMEM_PEER_BUSY_RATE`). Returns the bytes given back.
    pub fn watch_lenders(&self) -> Result<usize> {
        let reserve = self.peer_reserve;
        self.lock().watch_lenders(reserve)
    }

    /// The lenders whose own work keeps them busy, as the last look found them: their traffic
    /// is held to `TIERMEM_PEER_BUSY_RATE` and they carry no page-ins from host memory.
    pub fn busy_lenders(&self) -> Vec<usize> {
        let g = self.lock();
        g.tiers.peer.lenders().iter().map(|l| l.gpu).filter(|&gpu| g.tiers.peer.is_busy(gpu)).collect()
    }

    /// Copies up to `most` chunks whose only copy is in a lender's HBM to free host room, so
    /// that the lender can take that memory back without a copy; returns how many. The lender
    /// watch does this every poll while `peer_clean` is on (harvest.rs).
    pub fn clean_borrowed(&self, most: usize) -> Result<usize> {
        self.lock().clean_borrowed(most)
    }

    /// What GPU `gpu` lends to the peer tier becomes `bytes` (0: give everything back). Chunks
    /// in memory it no longer lends move before this returns: dropped where another copy
    /// exists, else copied to the host tier. Returns the bytes given back to the lender. It
    /// stays the most that GPU lends: the lender watch lowers what it lends when the lender
    /// is short of memory, and raises it again up to `bytes`, never beyond.
    pub fn set_peer_lending(&self, gpu: usize, bytes: usize) -> Result<usize> {
        self.lock().set_peer_lending(gpu, bytes)
    }

    /// Why GPUs of this machine do not lend to the peer tier, or a lender does not copy page-ins
    /// for this GPU (multipath), one line each, e.g. for `tiermem info`; empty when every
    /// neighbour lends and copies.
    pub fn peer_notes(&self) -> &[String] {
        &self.peer_notes
    }

    /// What the lenders could spare when the engine started, together: the most the peer tier
    /// borrows.
    pub fn peer_offered(&self) -> usize {
        self.lock().tiers.peer.lenders().iter().map(|l| l.offered).sum()
    }

    /// Borrows at most `bytes` from all lenders together from now on (the node daemon's budget
    /// of the peer tier), in whole slabs: divided evenly among them, none beyond what it
    /// offered at the start, what one cannot take going to the others. What exceeds a
    /// lender's part is given back before this returns (as [`Engine::set_peer_lending`]).
    /// Returns the bytes given back.
    pub fn set_peer_budget(&self, bytes: usize) -> Result<usize> {
        let mut inner = self.lock();
        let slab = inner.tiers.peer.slab_bytes().max(1);
        let lenders: Vec<(usize, usize)> =
            inner.tiers.peer.lenders().iter().map(|l| (l.gpu, l.offered / slab)).collect();
        let offers: Vec<usize> = lenders.iter().map(|&(_, offered)| offered).collect();
        for (&(gpu, _), part) in lenders.iter().zip(crate::lenders::divide_budget(&offers, bytes / slab)) {
            inner.tiers.peer.set_most(gpu, part * slab);
        }
        inner.reclaim_peer("set_peer_budget")
    }
}
