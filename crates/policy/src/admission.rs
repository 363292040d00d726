//! Working sets admitted whole: the node daemon's turns (`hbm_sharing = "working-sets"`, and
//! by default among programs under `tiermem run`).
//!
//! # Why
//! Fair share ([`crate::share`]) gives every busy tenant `weight × L` of a GPU. When the
//! tenants' working sets together exceed the GPU, every one of them then holds a part of its
//! working set and pages the rest through the same PCIe link on every pass: all of them run at
//! the link's pace, none at the GPU's. Paging cost is about linear in what a tenant lacks
//! (a loop over `S` bytes with `B` of them resident moves `S − B` a pass), so the total a pass
//! of everyone costs hardly depends on how the GPU is split — but a tenant that lacks nothing
//! moves nothing and runs at the GPU's own speed, beside the others. This is Denning's
//! working-set principle (run a working set whole or not at all, rather than all thrashing),
//! and what serial execution gets right and static thirds get wrong.
//!
//! # The rule
//! The caller lists the tenants in the order they should get their turn (priority, then who
//! holds a turn that has not run out, then least service so far: the daemon's registry). Going
//! down the list, a tenant is *admitted* — its whole demand (within its quota) becomes its
//! floor — while the admitted demands plus what every other tenant must keep still fit the
//! capacity. A tenant that is not admitted keeps at least `keep` (its acquired memory and room
//! for its next acquire, so it still makes progress) and shares what is left with the others
//! not admitted, by weight, as in fair share. When every working set fits, every tenant is
//! admitted and the result is fair share's. When none fits, no tenant is admitted — unless all
//! but the first can wait without running ([`admit_beyond`]): the first then has all the
//! others' keeps leave, in its turn. Nothing here knows about time: turns and their
//! order are the caller's.
//!
//! Everything here is pure: no clock, no I/O, no randomness.

use crate::share::Claim;

/// Which of `claims` are admitted with their whole demand, given `capacity` units, the least
/// each tenant must keep when it is not admitted (`keep`: see [`kept`]), and the `order` in
/// which tenants are tried (indices into `claims`; a tenant not listed is never admitted).
/// A demand above the capacity is never admitted.
pub fn admit(capacity: u64, claims: &[Claim], keep: &[u64], order: &[usize]) -> Vec<bool> {
    let keep = kept(claims, keep);
    let mut admitted = vec![false; claims.len()];
    // What the tenants ask of the capacity so far: the admitted ones' whole demand, the
    // others' keep. Only admissions that keep this within the capacity are made.
    let mut asked: u128 = keep.iter().map(|&k| u128::from(k)).sum();
    for &i in order {
        let (Some(claim), Some(&keeps)) = (claims.get(i), keep.get(i)) else { continue };
        if admitted[i] {
            continue;
        }
        let with = asked - u128::from(keeps) + u128::from(claim.high());
        if with <= u128::from(capacity) {
            admitted[i] = true;
            asked = with;
        }
    }
    admitted
}

/// When no working set fits (`admitted` has none) and every tenant listed in `order` after the
/// first can wait (`can_wait`: it launches nothing while it waits, a program under `tiermem
/// run`), the first is admitted all the same, with what the others' keeps leave: turns of the
/// whole GPU rather than everyone paging through one link at once (the others, held, lose only
/// time). Returns that tenant and its claim's demand to admit it with (its whole demand at
/// most), or `None` when the rule does not apply or nothing would be left for it.
pub fn admit_beyond(
    capacity: u64,
    claims: &[Claim],
    keep: &[u64],
    order: &[usize],
    can_wait: &[bool],
    admitted: &[bool],
) -> Option<(usize, u64)> {
    let (&first, rest) = order.split_first()?;
    let others_wait = !rest.is_empty() && rest.iter().all(|&i| can_wait.get(i).copied().unwrap_or(false));
    if admitted.iter().any(|&a| a) || !others_wait || first >= claims.len() {
        return None;
    }
    let keep = kept(claims, keep);
    let others: u128 = (0..claims.len()).filter(|&i| i != first).map(|i| u128::from(keep[i])).sum();
    let left = u64::try_from(u128::from(capacity).saturating_sub(others)).unwrap_or(u64::MAX);
    let demand = claims[first].high().min(left);
    (demand > keep[first]).then_some((first, demand))
}

/// Whether tenant `i`'s whole demand fits `capacity` beside every other tenant at what it
/// keeps ([`kept`]): whether it could be admitted once the turns of others end.
pub fn fits_alone(capacity: u64, claims: &[Claim], keep: &[u64], i: usize) -> bool {
    let keep = kept(claims, keep);
    let others: u128 = (0..claims.len()).filter(|&j| j != i).map(|j| u128::from(keep[j])).sum();
    claims.get(i).is_some_and(|c| u128::from(c.high()) + others <= u128::from(capacity))
}

/// What each tenant keeps when it is not admitted: `keep`, but at least its floor (acquired
/// memory is never taken away) and at most its whole demand.
pub fn kept(claims: &[Claim], keep: &[u64]) -> Vec<u64> {
    claims.iter().zip(keep).map(|(c, &k)| k.min(c.high()).max(c.floor)).collect()
}

/// `claims` as [`crate::share::fair_shares`] should see them: an admitted tenant's floor
/// raised to its whole demand (within its quota), so that it gets exactly that; another's to
/// what it keeps ([`kept`]), so that it gets at least that and shares the rest by weight.
pub fn with_admitted(claims: &[Claim], keep: &[u64], admitted: &[bool]) -> Vec<Claim> {
    let keep = kept(claims, keep);
    claims
        .iter()
        .zip(keep)
        .zip(admitted)
        .map(|((c, kept), &whole)| Claim { floor: if whole { c.high() } else { kept }, ..*c })
        .collect()
}
