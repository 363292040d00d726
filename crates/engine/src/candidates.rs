//! The one candidate builder: which chunks may leave their tier (HBM for the host, the host
//! for the file), with what the policy needs to choose among them, and, when none may leave
//! yet, what to wait for. Reads the chunk table, the schedule and the work in flight; changes
//! nothing (placement.rs acts on the answer).

use crate::fence::{settled, Fence};
use crate::in_flight::InFlight;
use crate::schedule::Schedule;
use crate::state::{ChunkRef, ChunkTable, Location};
use crate::sync::Arc;
use crate::BufferId;
use tiermem_mechanism::DeviceError;
use tiermem_policy::Candidate;

/// Which chunks may be chosen to leave their tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Among {
    /// Resident in HBM (evicted to the host, or dropped if clean).
    Resident,
    /// Located in the host tier (spilled to the file, or dropped if the file holds them).
    OnHost,
}

/// Chunks that may leave their tier, with their metadata: located in the tier `among`
/// names, not acquired, not protected, and next used beyond `horizon` steps (if given).
/// A resident chunk is clean if the host holds a copy; a host-located one if the file
/// does (the cost of the move is then no copy). Without a schedule only resident chunks whose
/// fences have completed are offered (the policy prefers what can leave at once); with one,
/// every chunk is, because Belady's order matters more than a wait: in a loop the chunk
/// just released is the one needed furthest away, and passing it over for an idle one
/// would evict a chunk that stays resident for the whole pass.
///
/// With a schedule, every chunk of a buffer has the buffer's next use, so buffers are
/// visited in Belady's order and only as many as give `count` chunks are offered (whole
/// groups of equal next use, so the policy still breaks ties among all of them): an
/// eviction looks at a few buffers, not at every chunk in HBM.
pub(crate) fn candidates(
    state: &ChunkTable,
    schedule: Option<&Schedule>,
    among: Among,
    protect: &[ChunkRef],
    horizon: Option<u64>,
    count: usize,
) -> Result<(Vec<ChunkRef>, Vec<Candidate>), DeviceError> {
    // Belady's order (the furthest next use first), the planned resident set last.
    type Key = (bool, Option<std::cmp::Reverse<u64>>);
    let mut order: Vec<(Key, BufferId)> = Vec::new();
    for (id, buffer) in state.buffers() {
        if among == Among::Resident && buffer.mapped() == 0 {
            continue;
        }
        let next_use = schedule.and_then(|s| s.next_use(id));
        if let (Some(horizon), Some(next)) = (horizon, next_use) {
            if next <= horizon {
                continue;
            }
        }
        let kept = schedule.is_some_and(|s| s.is_kept(id));
        order.push(((kept, next_use.map(std::cmp::Reverse)), id));
    }
    if schedule.is_some() {
        order.sort_unstable();
    }
    let (mut refs, mut candidates) = (Vec::new(), Vec::new());
    let mut group = None;
    for (key, id) in order {
        if schedule.is_some() && candidates.len() >= count && group != Some(key) {
            break;
        }
        group = Some(key);
        let buffer = state.buffer(id).expect("a live buffer");
        for (index, chunk) in buffer.chunks().iter().enumerate() {
            let (here, clean) = match among {
                Among::Resident => (chunk.is_resident(), chunk.host().is_some()),
                Among::OnHost => (matches!(chunk.location(), Location::Host(_)), chunk.file().is_some()),
            };
            if !here || chunk.pins() > 0 || protect.binary_search(&(id, index)).is_ok() {
                continue;
            }
            let unsettled = || Ok::<_, DeviceError>(!settled(chunk.ready())? || !settled(chunk.busy())?);
            if among == Among::Resident && schedule.is_none() && unsettled()? {
                continue;
            }
            candidates.push(Candidate {
                key: refs.len() as u64,
                last_use: chunk.last_use(),
                clean,
                priority: buffer.options.priority,
                next_use: key.1.map(|r| r.0),
                kept: key.0,
            });
            refs.push((id, index));
        }
    }
    Ok((refs, candidates))
}

/// What to wait for before HBM can be made free: the next copy down to land, or the work
/// still running on a chunk that could then be evicted. `Now` if such a chunk has no work
/// left: it finished since the candidates were listed (the GPU does not wait for the
/// engine), so evicting again will find it.
pub(crate) fn next_settling(in_flight: &InFlight, state: &ChunkTable, protect: &[ChunkRef]) -> Settling {
    if let Some(fence) = in_flight.next_landing() {
        return Settling::Wait(Arc::clone(fence));
    }
    let mut settled = false;
    for (r, chunk) in state.chunks() {
        if !chunk.is_resident() || chunk.pins() > 0 || protect.binary_search(&r).is_ok() {
            continue;
        }
        match chunk.in_flight().find(|f| !matches!(f.is_done(), Ok(true))) {
            Some(fence) => return Settling::Wait(Arc::clone(fence)),
            None => settled = true,
        }
    }
    if settled {
        Settling::Now
    } else {
        Settling::Never
    }
}

/// See [`next_settling`].
pub(crate) enum Settling {
    Wait(Arc<Fence>),
    Now,
    Never,
}
