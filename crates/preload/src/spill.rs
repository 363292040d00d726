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
//! borrowing GPU opens: a lender lends its free memory then, less the reserve.
//!
//! **Given back when a lender runs short**: at the program's quiesce points (no more often than
//! `TIERMEM_PEER_CHECK_MS`), [`shortfalls`] reads each lender's free memory; one below its
//! reserve (another program took memory there) is owed the difference, which migrate.rs gives
//! back at once (rounds.rs: spares released, chunks in use moved to the host), and it lends what
//! the engine's `recap` says from then on (nothing while short, up to what it offered once it
//! has room). That is at the program's pace, not within 100 ms as the engine's lenders, so a
//! transparent program borrows only when asked (`TIERMEM_PEERS` set, `tiermem run --peers`). A
//! GPU the program itself opens stops lending from then on (what it lent stays until freed):
//! its own allocations come first.
//!
//! **Shared out by the node daemon**: with `tiermemd` running and sharing the peer tier
//! (`[tiers] peer`), a GPU's tenant (lease.rs) reports what its lenders offered and what it
//! borrows, and the daemon's `peer` budget bounds what all its lenders lend it together
//! ([`set_budget`]): beyond it, chunks are made on the host, and what a cut leaves over is
//! given back like a shortfall ([`over_budget`]; migrate.rs, from the program's quiesce points
//! or, past a grace, a pause of tiermem's own).
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
    /// The most it lends now: what it could spare when the borrower opened, less what it asked
    /// back since, or what was lent when it turned out to be full.
    most: usize,
    /// What it could spare when the borrower opened: the most it lends again once it has room.
    offered: usize,
    /// The HBM it keeps free (`TIERMEM_PEER_RESERVE`).
    reserve: usize,
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
    /// Per borrowing GPU, the most all its lenders lend it together (the node daemon's `peer`
    /// budget); none: what they offer.
    budgets: HashMap<usize, usize>,
}

impl Books {
    /// Takes `len` bytes of the first lender of `borrower` with room for them: its GPU.
    fn take(&mut self, borrower: usize, len: usize) -> Option<usize> {
        let budget = self.budgets.get(&borrower).copied().unwrap_or(usize::MAX);
        if self.lent_to(borrower) + len > budget {
            return None;
        }
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

    /// `borrower`'s lender `gpu` has `free` bytes free now: what it lends from now on follows
    /// (the engine's `recap`: less, down to nothing, below its reserve; back up to what it
    /// offered once it has room). The bytes lent beyond that, to be given back.
    fn recap(&mut self, borrower: usize, gpu: usize, free: usize) -> usize {
        let lenders = self.lenders.get_mut(&borrower).into_iter().flatten();
        let Some(lender) = lenders.into_iter().find(|l| l.gpu == gpu) else { return 0 };
        let most = tiermem::lending_recap(lender.lent, free, lender.reserve, lender.offered);
        lender.most = if lender.withdrawn { lender.most.min(most) } else { most };
        lender.lent.saturating_sub(most)
    }

    /// The lenders of `borrower` that lend or have lent: their GPUs.
    fn lending_to(&self, borrower: usize) -> Vec<usize> {
        let lenders = self.lenders.get(&borrower).into_iter().flatten();
        lenders.filter(|l| l.lent > 0 || l.most < l.offered).map(|l| l.gpu).collect()
    }

    /// Bytes all lenders of `borrower` lend it now.
    fn lent_to(&self, borrower: usize) -> usize {
        self.lenders.get(&borrower).into_iter().flatten().map(|l| l.lent).sum()
    }

    /// Bytes the lenders of `borrower` offered when it opened, all together.
    fn offered_to(&self, borrower: usize) -> usize {
        self.lenders.get(&borrower).into_iter().flatten().filter(|l| !l.withdrawn).map(|l| l.offered).sum()
    }

    /// What `borrower` holds beyond its budget, per lender (`(GPU, bytes)`), taken from those
    /// that lend most first.
    fn over_budget(&self, borrower: usize) -> Vec<(usize, usize)> {
        let Some(&budget) = self.budgets.get(&borrower) else { return Vec::new() };
        let mut over = self.lent_to(borrower).saturating_sub(budget);
        let mut lenders: Vec<&Lender> = self.lenders.get(&borrower).into_iter().flatten().collect();
        lenders.sort_by_key(|l| std::cmp::Reverse(l.lent));
        let mut owed = Vec::new();
        for l in lenders {
            let bytes = over.min(l.lent);
            if bytes > 0 {
                owed.push((l.gpu, bytes));
                over -= bytes;
            }
        }
        owed
    }

    /// GPU `gpu` is the program's own from now on: it lends nothing more.
    fn withdraw(&mut self, gpu: usize) {
        for lender in self.lenders.values_mut().flatten().filter(|l| l.gpu == gpu) {
            lender.withdrawn = true;
        }
    }
}

static BOOKS: Mutex<Option<Books>> = Mutex::new(None);

/// Whether a neighbour lends to a GPU of this process: without one, nothing here is asked
/// (moves down and quiesce points check it without the lock).
static LENDING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether a neighbour lends to a GPU of this process (`TIERMEM_PEERS` named one that could).
pub fn lending() -> bool {
    LENDING.load(std::sync::atomic::Ordering::Relaxed)
}

fn books() -> MutexGuard<'static, Option<Books>> {
    // Each change under the lock is a few counter updates: consistent after a panic.
    BOOKS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The peer tier's settings from the environment (the engine's reading of them), if
/// `TIERMEM_PEERS` is set and not `off`; the error names the variable.
fn settings() -> Result<Option<EngineConfig>, String> {
    if std::env::var("TIERMEM_PEERS").map_or(true, |v| v.trim().is_empty()) {
        return Ok(None);
    }
    let config = EngineConfig::default().peer_tier_from_env().map_err(|e| e.to_string())?;
    Ok((config.peers != PeerChoice::Off).then_some(config))
}

/// GPU `ordinal` opened in this process (`device`): it borrows from the neighbours the peer
/// tier's settings name, and stops lending to the process's other GPUs.
pub fn opened(call: &str, ordinal: usize, device: &dyn Device) {
    books().get_or_insert_with(Books::default).withdraw(ordinal);
    let config = match settings() {
        Ok(Some(config)) => config,
        Ok(None) => return,
        Err(why) => return log(call, &why, "no neighbour lends HBM (auto, off, or GPU ordinals like 1,2)"),
    };
    let lending = match tiermem::peer_lending(device, &config) {
        Ok(lending) => lending,
        Err(why) => return log(call, &why.to_string(), "no neighbour lends HBM"),
    };
    let mut guard = books();
    let books = guard.get_or_insert_with(Books::default);
    let own: Vec<usize> = books.lenders.keys().copied().collect();
    let lenders = lending.lenders.iter().filter(|(gpu, _)| !own.contains(gpu));
    let reserve = config.peer_reserve(device.info().backend);
    let lender = |&(gpu, most): &(usize, usize)| Lender {
        gpu,
        most,
        offered: most,
        reserve,
        lent: 0,
        peak: 0,
        withdrawn: false,
    };
    let lenders: Vec<Lender> = lenders.map(lender).collect();
    let none = lenders.is_empty();
    books.lenders.insert(ordinal, lenders);
    if !none {
        LENDING.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    drop(guard);
    if none && crate::boundary::switch("TIERMEM_STATS", false) {
        log(call, &format!("GPU {ordinal}: no neighbour lends HBM ({})", lending.notes.join("; ")), "host memory only");
    }
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
                let full = crate::ipc::out_of_memory(&why);
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
    lender_of(handle).is_some()
}

/// The GPU whose HBM physical chunk `handle` lies in, if a neighbour lent it.
pub fn lender_of(handle: PhysHandle) -> Option<usize> {
    if !lending() {
        return None;
    }
    books().as_ref()?.chunks.get(&handle).map(|&(_, gpu, _)| gpu)
}

/// Per lender of GPU `ordinal` (`device`) that ran short of its reserve since it lent (another
/// program took memory there), the bytes to give it back now; what each lends from now on
/// follows its free memory (NVML). Nothing to do, and no look, while nobody lends.
pub fn shortfalls(ordinal: usize, device: &dyn Device) -> Vec<(usize, usize)> {
    let lending = books().as_ref().map(|books| books.lending_to(ordinal)).unwrap_or_default();
    let mut short = Vec::new();
    for gpu in lending {
        // Unknown free memory: as it was.
        let Ok(memory) = device.gpu_memory(gpu) else { continue };
        let owed = books().as_mut().map_or(0, |books| books.recap(ordinal, gpu, memory.free));
        if owed > 0 {
            short.push((gpu, owed));
        }
    }
    short
}

/// The node daemon's `peer` budget for GPU `ordinal`: the most its lenders lend it together
/// from now on; what it holds beyond is [`over_budget`].
pub fn set_budget(ordinal: usize, bytes: usize) {
    books().get_or_insert_with(Books::default).budgets.insert(ordinal, bytes);
}

/// What GPU `ordinal` holds in its lenders' HBM beyond its budget, per lender (`(GPU, bytes)`):
/// to give back.
pub fn over_budget(ordinal: usize) -> Vec<(usize, usize)> {
    books().as_ref().map(|books| books.over_budget(ordinal)).unwrap_or_default()
}

/// What GPU `ordinal`'s lenders lend it now and what they offered when it opened (all
/// lenders together), as the node daemon counts the peer tier.
pub fn borrowed(ordinal: usize) -> (usize, usize) {
    books().as_ref().map_or((0, 0), |books| (books.lent_to(ordinal), books.offered_to(ordinal)))
}

/// Bytes given back to lenders that ran short, so far.
static RETURNED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// `bytes` were given back to a lender that ran short (moved to the host or released).
pub fn returned(bytes: usize) {
    RETURNED.fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
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
    let returned = RETURNED.load(std::sync::atomic::Ordering::Relaxed);
    (!parts.is_empty()).then(|| {
        format!(
            "tiermem: stats: neighbours' HBM lent: {}; {} given back to lenders short of their reserve",
            parts.join("; "),
            format_size(returned)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn books(lenders: &[(usize, usize)]) -> Books {
        let lenders = lenders
            .iter()
            .map(|&(gpu, most)| Lender { gpu, most, offered: most, reserve: 0, lent: 0, peak: 0, withdrawn: false })
            .collect();
        Books { lenders: HashMap::from([(0, lenders)]), ..Books::default() }
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

    #[test]
    fn the_daemons_budget_bounds_all_lenders_together_and_a_cut_is_owed_by_the_largest_first() {
        let mut b = books(&[(1, 64), (2, 64)]);
        assert_eq!(b.over_budget(0), [], "no budget: nothing is owed");
        b.budgets.insert(0, 48);
        assert_eq!((b.take(0, 32), b.take(0, 16)), (Some(1), Some(1)));
        assert_eq!(b.take(0, 1), None, "48 lent: the budget is reached though GPU 2 has room");
        assert_eq!(b.offered_to(0), 128);
        b.budgets.insert(0, 80);
        assert_eq!(b.take(0, 32), Some(2));
        b.budgets.insert(0, 20);
        // 80 lent (48 by GPU 1, 32 by GPU 2) against 20: 60 owed, GPU 1 first.
        assert_eq!(b.over_budget(0), [(1, 48), (2, 12)]);
        b.give_back(0, 1, 48, false);
        assert_eq!(b.over_budget(0), [(2, 12)]);
        b.give_back(0, 2, 12, false);
        assert_eq!((b.over_budget(0), b.lent_to(0)), (vec![], 20));
    }
}
