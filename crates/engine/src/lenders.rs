//! Which neighbour GPUs lend HBM to the peer tier, and how much: a pure decision over what
//! the machine reports ([`Neighbour`]), so that it can be tested without GPUs.
//!
//! Borrowing must not make someone else's program run out of memory. So a neighbour lends its
//! free memory less a reserve (`TIERMEM_PEER_RESERVE`), all lenders together at most
//! `TIERMEM_PEER_LIMIT`; with `TIERMEM_PEERS=auto` only GPUs this one has peer access to and
//! on which no other process runs lend (a GPU named in `TIERMEM_PEERS` lends whatever runs
//! there). Every GPU left out has a note saying why, which `tiermem info` prints.

use crate::config::PeerChoice;
use crate::{format_size, EngineConfig, Error, Result};
use tiermem_mechanism::{Device, GpuMemory};

/// What the machine says of one other GPU.
#[derive(Debug, Clone)]
pub(crate) struct Neighbour {
    pub gpu: usize,
    /// This GPU can map and copy its memory (`cuDeviceCanAccessPeer`).
    pub access: bool,
    /// Its memory now, or why it is not known.
    pub memory: std::result::Result<GpuMemory, String>,
}

/// The lenders (GPU, bytes lent) and a note for each GPU that does not lend.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lending {
    pub lenders: Vec<(usize, usize)>,
    pub notes: Vec<String>,
}

/// The lending that `choice` gives GPU `me` of a machine of `count` GPUs.
pub(crate) fn lending(
    choice: &PeerChoice,
    me: usize,
    count: usize,
    neighbours: &[Neighbour],
    reserve: usize,
    limit: Option<usize>,
) -> Result<Lending> {
    let named = match choice {
        PeerChoice::Off => return Ok(Lending { lenders: Vec::new(), notes: vec!["TIERMEM_PEERS=off".into()] }),
        PeerChoice::Auto => None,
        PeerChoice::Gpus(gpus) => {
            for &gpu in gpus {
                if gpu == me {
                    return Err(Error::Config(format!("TIERMEM_PEERS names GPU {gpu}, the engine's own GPU")));
                }
                if gpu >= count {
                    return Err(Error::Config(format!(
                        "TIERMEM_PEERS names GPU {gpu}, but this machine has {count} GPU(s) (0 to {})",
                        count.saturating_sub(1)
                    )));
                }
                if !neighbours.iter().any(|n| n.gpu == gpu && n.access) {
                    return Err(Error::Config(format!(
                        "TIERMEM_PEERS names GPU {gpu}, but GPU {me} has no peer access to it (no NVLink or PCIe peer path)"
                    )));
                }
            }
            Some(gpus)
        }
    };
    let mut out = Lending::default();
    if count <= 1 {
        out.notes.push("this machine has one GPU".into());
    }
    let mut left = limit.unwrap_or(usize::MAX);
    for n in neighbours.iter().filter(|n| n.gpu != me) {
        if named.is_some_and(|gpus| !gpus.contains(&n.gpu)) {
            continue;
        }
        if !n.access {
            out.notes.push(format!("GPU {}: no peer access from GPU {me}", n.gpu));
            continue;
        }
        let memory = match &n.memory {
            Ok(memory) => memory,
            Err(why) => {
                out.notes.push(format!("GPU {}: its free memory is not known ({why})", n.gpu));
                continue;
            }
        };
        match memory.other_processes {
            Some(others) if others > 0 && named.is_none() => {
                out.notes.push(format!(
                    "GPU {}: {others} other process(es) use it; auto borrows only from idle GPUs (name it in TIERMEM_PEERS to borrow anyway)",
                    n.gpu
                ));
                continue;
            }
            _ => {}
        }
        let spare = memory.free.saturating_sub(reserve).min(left);
        if spare == 0 {
            out.notes.push(format!(
                "GPU {}: {} free, no more than the reserve of {} (TIERMEM_PEER_RESERVE){}",
                n.gpu,
                format_size(memory.free),
                format_size(reserve),
                if left == 0 { ", or TIERMEM_PEER_LIMIT reached" } else { "" }
            ));
            continue;
        }
        left -= spare;
        out.lenders.push((n.gpu, spare));
    }
    Ok(out)
}

/// Who would lend HBM to `device`'s peer tier under `config`, from what the machine reports
/// now, and why the other GPUs would not (`tiermem info` prints it; engines decide so at start).
pub fn peer_lending(device: &dyn Device, config: &EngineConfig) -> Result<Lending> {
    let info = device.info();
    let neighbours: Vec<Neighbour> = (0..info.device_count)
        .filter(|&gpu| gpu != info.ordinal)
        .map(|gpu| Neighbour {
            gpu,
            access: device.peer_access(gpu),
            memory: device.gpu_memory(gpu).map_err(|e| e.to_string()),
        })
        .collect();
    lending(
        &config.peers,
        info.ordinal,
        info.device_count,
        &neighbours,
        config.peer_reserve(info.backend),
        config.peer_limit,
    )
}

/// What a lender lends once it reports `free` bytes free (what is borrowed from it already
/// counts as used there): less, down to nothing, when its free memory falls below `reserve`;
/// more, up to `most` (what it lent at first), when memory frees up. (`tiermem lend` offers by it too.)
pub fn recap(borrowed: usize, free: usize, reserve: usize, most: usize) -> usize {
    match free.checked_sub(reserve) {
        Some(spare) => borrowed.saturating_add(spare).min(most),
        None => borrowed.saturating_sub(reserve - free),
    }
}

/// Divides a budget of `slabs` among lenders that offered `offers` slabs each (in order):
/// evenly, none beyond its offer, what one cannot take going to the others. Returns each
/// lender's part.
pub(crate) fn divide_budget(offers: &[usize], slabs: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..offers.len()).collect();
    order.sort_by_key(|&i| offers[i]);
    let (mut parts, mut left) = (vec![0; offers.len()], slabs);
    for (k, &i) in order.iter().enumerate() {
        parts[i] = offers[i].min(left / (offers.len() - k));
        left -= parts[i];
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_budget_is_divided_evenly_up_to_each_offer() {
        assert_eq!(divide_budget(&[4, 4], 5), vec![2, 3]);
        assert_eq!(divide_budget(&[1, 8, 8], 9), vec![1, 4, 4]);
        assert_eq!(divide_budget(&[2, 2], usize::MAX), vec![2, 2]);
        assert_eq!(divide_budget(&[], 3), Vec::<usize>::new());
    }

    proptest! {
        #[test]
        fn parts_stay_within_offers_and_add_up_to_the_budget(
            offers in prop::collection::vec(0usize..20, 0..6), slabs in 0usize..80
        ) {
            let parts = divide_budget(&offers, slabs);
            prop_assert!(parts.iter().zip(&offers).all(|(p, o)| p <= o));
            let offered: usize = offers.iter().sum();
            prop_assert_eq!(parts.iter().sum::<usize>(), slabs.min(offered), "all of it, as far as offered");
            // Lenders below their offer get even parts.
            let uncapped: Vec<usize> = parts.iter().zip(&offers).filter(|(p, o)| p < o).map(|(p, _)| *p).collect();
            let (most, fewest) = (uncapped.iter().max(), uncapped.iter().min());
            prop_assert!(most.zip(fewest).is_none_or(|(m, f)| m - f <= 1), "{parts:?} of {offers:?}");
        }
    }

    const GIB: usize = 1 << 30;

    fn idle(gpu: usize, free: usize) -> Neighbour {
        Neighbour {
            gpu,
            access: true,
            memory: Ok(GpuMemory { free, total: 141 * GIB, other_processes: Some(0), busy_percent: None }),
        }
    }

    #[test]
    fn auto_lends_free_memory_less_the_reserve_of_idle_reachable_gpus() {
        let busy = Neighbour {
            gpu: 2,
            access: true,
            memory: Ok(GpuMemory { free: 100 * GIB, total: 141 * GIB, other_processes: Some(1), busy_percent: None }),
        };
        let far = Neighbour { access: false, ..idle(3, 100 * GIB) };
        let got = lending(&PeerChoice::Auto, 0, 4, &[idle(1, 100 * GIB), busy, far], 4 * GIB, None).unwrap();
        assert_eq!(got.lenders, vec![(1, 96 * GIB)]);
        assert_eq!(got.notes.len(), 2, "{:?}", got.notes);
        // Named, the busy GPU lends too.
        let named = lending(&PeerChoice::Gpus(vec![2]), 0, 4, &[idle(1, 100 * GIB)], 4 * GIB, None);
        assert!(named.is_err(), "GPU 2 is not reachable in this list");
    }

    #[test]
    fn bad_names_are_clear_errors() {
        let n = [idle(1, GIB)];
        for (gpus, says) in [(vec![0], "own GPU"), (vec![5], "has 2 GPU(s)"), (vec![1, 1], "")] {
            match lending(&PeerChoice::Gpus(gpus), 0, 2, &n, 0, None) {
                Err(e) => assert!(e.to_string().contains(says), "{e}"),
                Ok(_) => assert!(says.is_empty()),
            }
        }
    }

    proptest! {
        #[test]
        fn a_lender_short_of_its_reserve_gets_back_what_it_misses(
            borrowed in 0usize..100, free in 0usize..100, reserve in 0usize..50, most in 0usize..150,
        ) {
            let cap = recap(borrowed, free, reserve, most);
            if free < reserve {
                prop_assert_eq!(cap, borrowed.saturating_sub(reserve - free));
            } else {
                prop_assert!(cap <= most);
                prop_assert!(cap >= borrowed.min(most));
                // Borrowing up to the cap leaves the reserve free.
                prop_assert!(cap - borrowed.min(cap) <= free - reserve);
            }
        }

        #[test]
        fn lending_never_exceeds_free_less_reserve_nor_the_limit(
            free in prop::collection::vec(0usize..200, 1..6),
            reserve in 0usize..50,
            limit in prop::option::of(0usize..400),
        ) {
            let neighbours: Vec<Neighbour> = free.iter().enumerate().map(|(i, &f)| idle(i + 1, f * GIB)).collect();
            let got = lending(&PeerChoice::Auto, 0, free.len() + 1, &neighbours, reserve * GIB, limit.map(|l| l * GIB)).unwrap();
            let mut total = 0;
            for &(gpu, bytes) in &got.lenders {
                prop_assert!(bytes > 0);
                prop_assert!(bytes <= (free[gpu - 1] * GIB).saturating_sub(reserve * GIB));
                total += bytes;
            }
            prop_assert!(total <= limit.map_or(usize::MAX, |l| l * GIB));
            prop_assert_eq!(got.lenders.len() + got.notes.len(), free.len());
        }
    }
}
