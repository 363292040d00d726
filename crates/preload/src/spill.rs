//! Neighbours' HBM for the chunks beyond a GPU's budget (issue 16: "in pinned host memory …
//! or in a neighbour's HBM once the peer tier exists").
//!
//! A chunk that does not fit in its GPU's budget is made in the HBM of a neighbour that lends,
//! while that neighbour has room, and in host memory only after: kernels that touch it read it
//! over NVLink where they lie, and moves to and from it copy over NVLink instead of PCIe. In the
//! books it is beyond the budget like a host chunk (`Tier::Host`, placement.rs): the policy ranks
//! it with them and brings it up when it is hot; only where it is made differs, so this module is
//! all that knows of lenders.
//!
//! **Who lends, and how much**: the engine's peer tier decides (crates/engine/src/lenders.rs),
//! over `TIERMEM_PEERS`, `TIERMEM_PEER_RESERVE` and `TIERMEM_PEER_LIMIT`, once, when the
//! borrowing GPU opens: a lender lends its free memory then, less the reserve. Unlike the
//! engine, a transparent program borrows only when asked (`TIERMEM_PEERS` set, `tiermem run
//! --peers`): it gives a neighbour's memory back only when it frees the allocation or a move
//! brings the chunk up, not within 100 ms of the lender running short as the engine does, so it
//! must not take by default what another job on that GPU may need. A GPU the program itself
//! opens stops lending from then on (what it lent stays until freed): its own allocations come
//! first.
//!
//! The books here are a leaf lock: nothing is called under it but arithmetic.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use tiermem::{format_size, EngineConfig, PeerChoice};
use tiermem_mechanism::{ChunkLocation, Device, DeviceError, PhysHandle};

use crate::boundary::log;

/// One neighbour lending to one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Lender {
    gpu: usize,
    /// The most it lends: what it could spare when the borrower opened, or what was lent when
    /// it turned out to be full.
    most: usize,
    lent: usize,
    peak: usize,
    /// The program opened this GPU itself: it lends nothing more.
    withdrawn: bool,
}

#[derive(Default)]
struct Books {
    /// Per borrowing GPU, its lenders in the engine's order.
    lenders: HashMap<usize, Vec<Lender>>,
    /// Each chunk made on a lender: (borrowing GPU, lender's GPU, bytes).
    chunks: HashMap<PhysHandle, (usize, usize, usize)>,
}

impl Books {
    /// Takes `len` bytes of the first lender of `borrower` with room for them: its GPU.
    fn take(&mut self, borrower: usize, len: usize) -> Option<usize> {
        let lender = self
            .lenders
            .get_mut(&borrower)?
            .iter_mut()
            .find(|l| !l.withdrawn && l.most.saturating_sub(l.lent) >= len)?;
        lender.lent += len;
        lender.peak = lender.peak.max(lender.lent);
        Some(lender.gpu)
    }

    /// Gives `len` bytes back to `borrower`'s lender `gpu`; `full`: it had no room after all,
    /// and lends no more than it has lent.
    fn give_back(&mut self, borrower: usize, gpu: usize, len: usize, full: bool) {
        let lenders = self.lenders.get_mut(&borrower).into_iter().flatten();
        for lender in lenders.filter(|l| l.gpu == gpu) {
            lender.lent = lender.lent.saturating_sub(len);
            if full {
                lender.most = lender.lent;
            }
        }
    }

    /// GPU `gpu` is the program's own from now on: it lends nothing more.
    fn withdraw(&mut self, gpu: usize) {
        for lender in self.lenders.values_mut().flatten().filter(|l| l.gpu == gpu) {
            lender.withdrawn = true;
        }
    }
}

static BOOKS: Mutex<Option<Books>> = Mutex::new(None);

fn books() -> MutexGuard<'static, Option<Books>> {
    // Each change under the lock is a few counter updates: consistent after a panic.
    BOOKS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The peer tier's settings from the environment, if `TIERMEM_PEERS` asks for lenders; the
/// error names the variable.
fn settings() -> Result<Option<EngineConfig>, String> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let Some(peers) = var("TIERMEM_PEERS") else { return Ok(None) };
    let peers: PeerChoice = peers.parse().map_err(|e| format!("TIERMEM_PEERS: {e}"))?;
    if peers == PeerChoice::Off {
        return Ok(None);
    }
    let size = |name: &str| var(name).map(|v| tiermem::parse_size(&v).map_err(|e| format!("{name}: {e}"))).transpose();
    Ok(Some(EngineConfig {
        peers,
        peer_reserve: size("TIERMEM_PEER_RESERVE")?,
        peer_limit: size("TIERMEM_PEER_LIMIT")?,
        ..EngineConfig::default()
    }))
}

/// GPU `ordinal` opened in this process (`device`): it borrows from the neighbours the peer
/// tier's settings name, and stops lending to the process's other GPUs.
pub fn opened(call: &str, ordinal: usize, device: &dyn Device) {
    let mut guard = books();
    let books = guard.get_or_insert_with(Books::default);
    books.withdraw(ordinal);
    let config = match settings() {
        Ok(Some(config)) => config,
        Ok(None) => return,
        Err(why) => return log(call, &why, "no neighbour lends HBM (auto, off, or GPU ordinals like 1,2)"),
    };
    let lending = match tiermem::peer_lending(device, &config) {
        Ok(lending) => lending,
        Err(why) => return log(call, &why.to_string(), "no neighbour lends HBM"),
    };
    let own: Vec<usize> = books.lenders.keys().copied().collect();
    let lenders = lending.lenders.iter().filter(|(gpu, _)| !own.contains(gpu));
    let lenders: Vec<Lender> =
        lenders.map(|&(gpu, most)| Lender { gpu, most, lent: 0, peak: 0, withdrawn: false }).collect();
    if lenders.is_empty() && crate::boundary::switch("TIERMEM_STATS", false) {
        log(call, &format!("GPU {ordinal}: no neighbour lends HBM ({})", lending.notes.join("; ")), "host memory only");
    }
    books.lenders.insert(ordinal, lenders);
}

/// A chunk of `len` bytes for GPU `ordinal` in a neighbour's HBM, if one lends room for it.
pub fn create_lent(device: &dyn Device, ordinal: usize, len: usize) -> Option<PhysHandle> {
    let granules = len / device.info().granularity.max(1);
    loop {
        let gpu = books().as_mut()?.take(ordinal, len)?;
        match crate::ipc::create_chunk(device, ChunkLocation::Gpu(gpu), granules) {
            Ok(handle) => {
                books().as_mut()?.chunks.insert(handle, (ordinal, gpu, len));
                return Some(handle);
            }
            // Its memory went to someone else since it offered it: it lends no more; the next may.
            Err(why) => {
                let full = matches!(why, DeviceError::OutOfMemory { .. })
                    || matches!(&why, DeviceError::Driver { code, .. } if code.contains("OUT_OF_MEMORY"));
                if !full {
                    log(
                        "cuMemCreate",
                        &format!("a chunk on GPU {gpu} could not be made ({why})"),
                        "GPU {gpu} lends no more",
                    );
                }
                books().as_mut()?.give_back(ordinal, gpu, len, true);
            }
        }
    }
}

/// A chunk of `len` bytes beyond GPU `ordinal`'s budget: on a neighbour that lends room for it,
/// else in host memory.
pub fn create_beyond(device: &dyn Device, ordinal: usize, len: usize) -> Result<PhysHandle, DeviceError> {
    match create_lent(device, ordinal, len) {
        Some(handle) => Ok(handle),
        None => crate::ipc::create_chunk(device, ChunkLocation::Host, len / device.info().granularity.max(1)),
    }
}

/// Whether physical chunk `handle` lies in a neighbour's HBM.
pub fn is_lent(handle: PhysHandle) -> bool {
    books().as_ref().is_some_and(|books| books.chunks.contains_key(&handle))
}

/// Gives physical chunk `handle` back to the driver, and to its lender if it was lent.
pub fn release(device: &dyn Device, handle: PhysHandle) -> Result<(), DeviceError> {
    device.release_chunk(handle)?;
    if let Some(books) = books().as_mut() {
        if let Some((borrower, gpu, len)) = books.chunks.remove(&handle) {
            books.give_back(borrower, gpu, len, false);
        }
    }
    Ok(())
}

/// The most bytes lent at once by any one neighbour to any one GPU (`TIERMEM_STATS_JSON`).
pub fn peak_bytes() -> usize {
    books().as_ref().map_or(0, |books| books.lenders.values().flatten().map(|l| l.peak).max().unwrap_or(0))
}

/// The `--stats` line, if a neighbour lent: per lender, what it offered, its peak and what is
/// lent at exit.
pub fn report() -> Option<String> {
    let guard = books();
    let mut parts: Vec<String> = Vec::new();
    for (borrower, lenders) in guard.as_ref()?.lenders.iter() {
        for l in lenders {
            parts.push(format!(
                "GPU {} to GPU {borrower}: up to {}, peak {}, {} at exit",
                l.gpu,
                format_size(l.most.max(l.peak)),
                format_size(l.peak),
                format_size(l.lent)
            ));
        }
    }
    (!parts.is_empty()).then(|| format!("tiermem: stats: neighbours' HBM lent: {}", parts.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn books(lenders: &[(usize, usize)]) -> Books {
        let lenders =
            lenders.iter().map(|&(gpu, most)| Lender { gpu, most, lent: 0, peak: 0, withdrawn: false }).collect();
        Books { lenders: HashMap::from([(0, lenders)]), chunks: HashMap::new() }
    }

    #[test]
    fn lenders_are_taken_in_order_while_they_have_room() {
        let mut b = books(&[(1, 64), (2, 32)]);
        assert_eq!(b.take(0, 32), Some(1));
        assert_eq!(b.take(0, 32), Some(1));
        assert_eq!(b.take(0, 32), Some(2), "GPU 1 is full, GPU 2 has room");
        assert_eq!(b.take(0, 1), None, "no room anywhere: the host takes it");
        assert_eq!(b.take(3, 1), None, "a GPU without lenders");
        b.give_back(0, 1, 32, false);
        assert_eq!(b.take(0, 16), Some(1), "what came back is lent again");
    }

    #[test]
    fn a_lender_found_full_or_withdrawn_lends_no_more_than_it_has_lent() {
        let mut b = books(&[(1, 64), (2, 64)]);
        assert_eq!(b.take(0, 16), Some(1));
        b.give_back(0, 1, 0, true);
        assert_eq!(b.take(0, 16), Some(2), "GPU 1 said it was full");
        b.withdraw(2);
        assert_eq!(b.take(0, 16), None, "GPU 2 is the program's own now");
        b.give_back(0, 2, 16, false);
        assert_eq!(b.take(0, 1), None, "a withdrawn lender takes nothing back");
        let peaks: Vec<usize> = b.lenders[&0].iter().map(|l| l.peak).collect();
        assert_eq!(peaks, [16, 16]);
    }
}
