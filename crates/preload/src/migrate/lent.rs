//! Neighbours' HBM given back from migration (spill.rs keeps the books): to a lender that ran
//! short of its reserve, and what exceeds the node daemon's `peer` budget — at the program's
//! quiesce points, or in a pause of tiermem's own when a budget cut is not met within the grace.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::{
    config, gate, grace, now_ms, own_pause, process, remap, rounds, synchronize, try_state, Phase, State, OFF,
};

/// Neighbours that ran short of their reserve since they lent (spill.rs) get it back here, and
/// what exceeds the node daemon's budget of their HBM: the gate held exclusively and the
/// context waited for, as for any move. Looked at no more often than `TIERMEM_PEER_CHECK_MS`
/// per GPU; if it cannot be now (another migration, a capture), the next look finds them owed
/// again.
pub(super) fn give_back_lent(call: &str) {
    static LAST_LOOK_MS: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];
    if !crate::spill::lending() {
        return;
    }
    let Some(Ok(ordinal)) = process::current_gpu() else { return };
    let Some(last) = LAST_LOOK_MS.get(ordinal) else { return };
    // +1: the first look (at 0 ms) is not taken for "never".
    let now = now_ms() + 1;
    let before = last.load(Relaxed);
    if before != 0 && now - before < config().peer_check {
        return;
    }
    last.store(now, Relaxed);
    let Some(device) = process::lock().gpus.get(&ordinal).and_then(|gpu| gpu.device.clone()) else { return };
    let owed = crate::spill::shortfalls(ordinal, device.as_ref());
    if owed.is_empty() && crate::spill::over_budget(ordinal).is_empty() {
        return;
    }
    let Some(mut state) = try_state() else { return };
    let state = state.get_or_insert_with(State::default);
    let _gate = gate::exclusive();
    if gate::forbidden().is_some() || !remap::timed(Phase::Wait, synchronize) {
        return;
    }
    return_lent(call, ordinal, owed, state);
}

/// Gives GPU `ordinal`'s lenders back what is `owed` (`(lender, bytes)`), then what exceeds
/// the daemon's budget (rounds.rs: spares released, chunks in use moved to the host). The gate
/// held exclusively and the GPU waited for.
fn return_lent(call: &str, ordinal: usize, owed: Vec<(usize, usize)>, state: &mut State) {
    let mut p = process::lock();
    let Some(batch) = p.gpus.get(&ordinal).map(|gpu| config().batch(gpu.chunk)) else { return };
    let tools = state.gpus.entry(ordinal).or_default();
    let mut give = |p: &mut process::Process, (lender, bytes): (usize, usize), why: &str| {
        let given = rounds::return_lent(call, p, ordinal, (lender, bytes), tools, batch);
        crate::spill::returned(given);
        crate::trace::event("given_back_to_lender", || {
            format!("\"gpu\": {lender}, \"owed\": {bytes}, \"given\": {given}, \"why\": \"{why}\"")
        });
    };
    for owed in owed {
        give(&mut p, owed, "reserve");
    }
    for owed in crate::spill::over_budget(ordinal) {
        give(&mut p, owed, "budget");
    }
}

/// Meets GPU `ordinal`'s budget of neighbours' HBM, which the node daemon just lowered
/// (lease.rs): as [`meet`] does for HBM, the program's own quiesce points get
/// `TIERMEM_SHED_GRACE_MS` to give the excess back, then a pause of tiermem's own does (from
/// this thread: an idle program gives it back too). Whether it is met, or why not.
pub fn meet_lent(call: &str, ordinal: usize) -> Result<(), String> {
    let met = || crate::spill::over_budget(ordinal).is_empty();
    if met() {
        return Ok(());
    }
    if !config().enabled {
        return Err(OFF.into());
    }
    if grace(met) {
        return Ok(());
    }
    own_pause(ordinal, |state| return_lent(call, ordinal, Vec::new(), state))?;
    match crate::spill::over_budget(ordinal).iter().map(|&(_, bytes)| bytes).sum::<usize>() {
        0 => Ok(()),
        left => Err(format!(
            "{} of neighbours' HBM still lent over the budget: the rest is in chunks that failed to move (said above)",
            tiermem::format_size(left)
        )),
    }
}
