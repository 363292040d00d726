//! Which kept async frees (deferred.rs) to give back: pure, so it is property-tested apart from
//! the driver. Each kept free is seen as a [`Free`] summary, oldest first.
//!
//! * At a quiesce point the driver's pool keeps freed memory up to its release threshold and
//!   gives back the rest: [`beyond_threshold`] keeps, per GPU, the newest frees that are done
//!   with up to `keep(gpu)` bytes (a free still pending stays whatever its size: its stream may
//!   still use it).
//! * When an allocation does not fit the budget, [`oldest_holding_hbm`] picks the oldest frees
//!   of that GPU that are done with and hold HBM — only the *stale* ones, not freed in the last
//!   cycles that allocated, if asked — until they add up to what it lacks: what has waited
//!   longest for a reuse goes first, and frees that the next step will take back stay at their
//!   addresses.

/// What the choices need to know of one kept free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Free {
    pub gpu: usize,
    /// Bytes it reserves (the threshold counts these).
    pub bytes: usize,
    /// Bytes of it in HBM now.
    pub hbm: usize,
    /// Its stream has passed the free: it may be unmapped.
    pub done: bool,
    /// Not freed in the last cycles that allocated (deferred.rs): no step is taking it back.
    pub stale: bool,
}

/// For each kept free (oldest first), whether it is given back at a quiesce point: done with,
/// and not among the newest done frees of its GPU that fit in `keep(gpu)` bytes.
pub fn beyond_threshold(kept: &[Free], keep: impl Fn(usize) -> usize) -> Vec<bool> {
    let mut left: std::collections::BTreeMap<usize, usize> = std::collections::BTreeMap::new();
    let mut release = vec![false; kept.len()];
    for (index, k) in kept.iter().enumerate().rev() {
        let room = left.entry(k.gpu).or_insert_with(|| keep(k.gpu));
        match (k.done, k.bytes <= *room) {
            (false, _) => {}
            (true, true) => *room -= k.bytes,
            (true, false) => release[index] = true,
        }
    }
    release
}

/// The indices of the oldest kept frees of GPU `gpu` that are done with and hold HBM (and are
/// stale, if `stale_only`), until their HBM adds up to `need` bytes (all such frees if they
/// do not).
pub fn oldest_holding_hbm(kept: &[Free], gpu: usize, need: usize, stale_only: bool) -> Vec<usize> {
    let mut hbm = 0;
    let mut chosen = Vec::new();
    for (index, k) in kept.iter().enumerate() {
        if hbm >= need {
            break;
        }
        if k.done && k.gpu == gpu && k.hbm > 0 && (k.stale || !stale_only) {
            hbm += k.hbm;
            chosen.push(index);
        }
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: usize = 1 << 20;

    fn kept(gpu: usize, mib: usize, done: bool) -> Free {
        Free { gpu, bytes: mib * MIB, hbm: mib * MIB, done, stale: false }
    }

    #[test]
    fn the_newest_done_frees_stay_up_to_the_threshold() {
        let list = [kept(0, 4, true), kept(0, 6, true), kept(0, 4, true), kept(0, 8, false)];
        assert_eq!(
            beyond_threshold(&list, |_| 8 * MIB),
            [false, true, false, false],
            "4 + 4 stay, 6 goes, pending stays"
        );
        assert_eq!(beyond_threshold(&list, |_| 0), [true, true, true, false], "threshold 0: every done free goes");
        assert_eq!(beyond_threshold(&list, |_| usize::MAX), [false; 4]);
    }

    #[test]
    fn each_gpu_has_its_own_threshold() {
        let list = [kept(0, 4, true), kept(1, 4, true), kept(0, 4, true)];
        assert_eq!(beyond_threshold(&list, |gpu| if gpu == 0 { 4 * MIB } else { 0 }), [true, true, false]);
    }

    #[test]
    fn an_allocation_takes_the_oldest_frees_holding_hbm_until_it_fits() {
        let mut list = vec![kept(0, 4, true), kept(0, 4, false), kept(1, 4, true), kept(0, 4, true), kept(0, 4, true)];
        list[3].hbm = 0;
        assert_eq!(
            oldest_holding_hbm(&list, 0, 6 * MIB, false),
            [0, 4],
            "pending, other GPUs' and host-only frees skipped"
        );
        assert_eq!(oldest_holding_hbm(&list, 0, 4 * MIB, false), [0]);
        assert_eq!(oldest_holding_hbm(&list, 0, 0, false), Vec::<usize>::new());
        assert_eq!(oldest_holding_hbm(&list, 0, 64 * MIB, false), [0, 4], "all there are");
        list[4].stale = true;
        assert_eq!(oldest_holding_hbm(&list, 0, 64 * MIB, true), [4], "only the stale, if asked");
    }

    fn any_kept() -> impl Strategy<Value = Free> {
        (0..3usize, 1..8usize, 0..8usize, any::<bool>(), any::<bool>()).prop_map(|(gpu, mib, hbm, done, stale)| Free {
            gpu,
            bytes: mib * MIB,
            hbm: hbm.min(mib) * MIB,
            done,
            stale,
        })
    }

    proptest! {
        #[test]
        fn what_a_quiesce_point_keeps_fits_the_threshold_and_is_the_newest(
            list in prop::collection::vec(any_kept(), 0..24),
            thresholds in prop::array::uniform3(0..40usize),
        ) {
            let keep = |gpu: usize| thresholds[gpu] * MIB;
            let release = beyond_threshold(&list, keep);
            for gpu in 0..3 {
                let kept_done: usize = list.iter().zip(&release)
                    .filter(|(k, &r)| k.gpu == gpu && k.done && !r).map(|(k, _)| k.bytes).sum();
                prop_assert!(kept_done <= keep(gpu), "GPU {gpu} keeps {kept_done} over {}", keep(gpu));
            }
            for (index, (k, &r)) in list.iter().zip(&release).enumerate() {
                prop_assert!(!r || k.done, "a pending free is never given back");
                if r {
                    // Released because the newer done frees of its GPU that stay, with it, would
                    // pass the threshold.
                    let newer_kept: usize = list[index + 1..].iter().zip(&release[index + 1..])
                        .filter(|(n, &nr)| n.gpu == k.gpu && n.done && !nr).map(|(n, _)| n.bytes).sum();
                    prop_assert!(newer_kept + k.bytes > keep(k.gpu));
                }
            }
        }

        #[test]
        fn an_allocation_frees_at_least_what_it_needs_from_the_oldest(
            list in prop::collection::vec(any_kept(), 0..24),
            gpu in 0..3usize,
            need_mib in 0..48usize,
            stale_only in any::<bool>(),
        ) {
            let need = need_mib * MIB;
            let chosen = oldest_holding_hbm(&list, gpu, need, stale_only);
            let eligible: Vec<usize> = (0..list.len())
                .filter(|&i| list[i].done && list[i].gpu == gpu && list[i].hbm > 0 && (list[i].stale || !stale_only))
                .collect();
            prop_assert_eq!(&chosen[..], &eligible[..chosen.len()], "a prefix of the eligible, oldest first");
            let hbm: usize = chosen.iter().map(|&i| list[i].hbm).sum();
            prop_assert!(hbm >= need || chosen.len() == eligible.len(), "enough, or all there are");
            if let Some((&last, rest)) = chosen.split_last() {
                let before: usize = rest.iter().map(|&i| list[i].hbm).sum();
                prop_assert!(before < need, "no more than needed: {} before the last already covered {need}", before);
                let _ = last;
            }
        }
    }
}
