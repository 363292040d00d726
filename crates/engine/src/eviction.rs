//! Making room in HBM: victims chosen by the policy (Belady's choice while a schedule is set)
//! among chunks that are resident, not acquired and not protected, sent down and waited for.
//! This and a page-in ahead of the schedule (which waits for its victims to pace the caller
//! to the GPU) are where the host waits for copies.

use crate::engine::Inner;
use crate::error::Context;
use crate::fence::{settled, Fence, Waits};
use crate::state::{ChunkRef, Location};
use crate::BufferId;
use crate::{Error, Result};
use std::sync::Arc;
use tiermem_mechanism::DeviceError;
use tiermem_policy::{new_policy, Candidate, PolicyKind};

impl Inner {
    /// Frees HBM until `need` chunks can be taken from the pool, evicting by policy.
    pub(crate) fn make_room(&mut self, call: &'static str, need: usize, protect: &[ChunkRef]) -> Result<()> {
        loop {
            self.reap()?;
            let available = self.pool.available();
            if available >= need {
                return Ok(());
            }
            let short = need - available;
            if self.evict(call, short, protect, None)? {
                continue;
            }
            match self.next_settling(protect) {
                Settling::Wait(fence) => self.wait_for(call, vec![fence])?,
                Settling::Now => {}
                Settling::Never => {
                    return Err(Error::OutOfMemory {
                        call,
                        detail: format!(
                        "{} more bytes of HBM are needed and every resident chunk is acquired or being acquired; {}",
                        short * self.chunk,
                        self.describe_tiers()
                    ),
                    })
                }
            }
        }
    }

    /// For a page-in ahead of the schedule: evicts up to `need` chunks whose next use is
    /// further than `horizon` steps away, and waits until they have left. In a loop the victim
    /// is usually the chunk just released, still read by work the GPU has queued; waiting for
    /// it paces the caller to the GPU while the copies already enqueued keep the link busy
    /// (stopping instead lets the caller run ahead, and every later chunk becomes a demand).
    /// `false` if nothing may leave.
    pub(crate) fn evict_beyond(
        &mut self,
        call: &'static str,
        need: usize,
        protect: &[ChunkRef],
        horizon: u64,
    ) -> Result<bool> {
        self.reap()?;
        self.evict(call, need, protect, Some(horizon))
    }

    /// Evicts up to `count` chunks that may leave (next used beyond `horizon`, if given), chosen
    /// by the policy (Belady while a schedule is set), and waits until they have left.
    /// `false` if there was nothing to evict.
    fn evict(&mut self, call: &'static str, count: usize, protect: &[ChunkRef], horizon: Option<u64>) -> Result<bool> {
        let victims = self.victims(Among::Resident, call, count, protect, horizon)?;
        if victims.is_empty() {
            return Ok(false);
        }
        self.evict_now(call, &victims)?;
        Ok(true)
    }

    /// Up to `count` chunks that may leave (as for [`Inner::candidates`]), the policy's
    /// choice, sorted.
    pub(crate) fn victims(
        &mut self,
        among: Among,
        call: &'static str,
        count: usize,
        protect: &[ChunkRef],
        horizon: Option<u64>,
    ) -> Result<Vec<ChunkRef>> {
        let (refs, candidates) = self.candidates(among, protect, horizon, count).during(call)?;
        let mut victims: Vec<ChunkRef> = self.select_victims(&candidates, count).into_iter().map(|i| refs[i]).collect();
        victims.sort_unstable();
        Ok(victims)
    }

    /// Sends `victims` (sorted) down and waits until they have left.
    pub(crate) fn evict_now(&mut self, call: &'static str, victims: &[ChunkRef]) -> Result<()> {
        let fences = self.send_victims_down(call, victims)?;
        self.wait_for(call, fences)?;
        self.reap()
    }

    /// Waits for `fences`: with the lock released if the façade retries this call (returned
    /// to it as [`Error::MustWait`]), else here, under the lock. Counted as eviction waits.
    pub(crate) fn wait_for(&mut self, call: &'static str, fences: Vec<Arc<Fence>>) -> Result<()> {
        if fences.is_empty() {
            return Ok(());
        }
        if self.wait_unlocked {
            return Err(Error::MustWait(Waits { call, fences }));
        }
        let started = std::time::Instant::now();
        for fence in fences {
            fence.wait().during(call)?;
        }
        self.counters.evict_wait_ms += started.elapsed().as_secs_f64() * 1e3;
        Ok(())
    }

    /// Sends `victims` (sorted) down without waiting, counted as evictions; with a schedule
    /// they are marked as streamed (homes.rs).
    pub(crate) fn send_victims_down(&mut self, call: &'static str, victims: &[ChunkRef]) -> Result<Vec<Arc<Fence>>> {
        self.counters.evictions += victims.len() as u64;
        if self.schedule.is_some() {
            victims.iter().for_each(|&r| self.state.mark_streamed(r));
        }
        self.send_down(call, victims)
    }

    /// The policy's choice among `candidates`; Belady's while a schedule is set.
    pub fn select_victims(&mut self, candidates: &[Candidate], count: usize) -> Vec<usize> {
        match self.schedule {
            Some(_) => new_policy(PolicyKind::Belady, 0).select_victims(candidates, count),
            None => self.policy.select_victims(candidates, count),
        }
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
    fn candidates(
        &self,
        among: Among,
        protect: &[ChunkRef],
        horizon: Option<u64>,
        count: usize,
    ) -> Result<(Vec<ChunkRef>, Vec<Candidate>), DeviceError> {
        let mut order: Vec<(Option<std::cmp::Reverse<u64>>, BufferId)> = Vec::new();
        for (id, buffer) in self.state.buffers() {
            if among == Among::Resident && buffer.mapped() == 0 {
                continue;
            }
            let next_use = self.schedule.as_ref().and_then(|s| s.next_use(id));
            if let (Some(horizon), Some(next)) = (horizon, next_use) {
                if next <= horizon {
                    continue;
                }
            }
            order.push((next_use.map(std::cmp::Reverse), id));
        }
        if self.schedule.is_some() {
            order.sort_unstable();
        }
        let (mut refs, mut candidates) = (Vec::new(), Vec::new());
        let mut group = None;
        for (key, id) in order {
            if self.schedule.is_some() && candidates.len() >= count && group != Some(key) {
                break;
            }
            group = Some(key);
            let buffer = self.state.buffer(id).expect("a live buffer");
            for (index, chunk) in buffer.chunks().iter().enumerate() {
                let (here, clean) = match among {
                    Among::Resident => (chunk.is_resident(), chunk.host().is_some()),
                    Among::OnHost => (matches!(chunk.location(), Location::Host(_)), chunk.file().is_some()),
                };
                if !here || chunk.pins() > 0 || protect.binary_search(&(id, index)).is_ok() {
                    continue;
                }
                let unsettled = || Ok::<_, DeviceError>(!settled(chunk.ready())? || !settled(chunk.busy())?);
                if among == Among::Resident && self.schedule.is_none() && unsettled()? {
                    continue;
                }
                candidates.push(Candidate {
                    key: refs.len() as u64,
                    last_use: chunk.last_use(),
                    clean,
                    priority: buffer.options.priority,
                    next_use: key.map(|r| r.0),
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
    fn next_settling(&self, protect: &[ChunkRef]) -> Settling {
        if let Some(fence) = self.in_flight.next_landing() {
            return Settling::Wait(Arc::clone(fence));
        }
        let mut settled = false;
        for (r, chunk) in self.state.chunks() {
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
}

/// Which chunks may be chosen to leave their tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Among {
    /// Resident in HBM (evicted to the host, or dropped if clean).
    Resident,
    /// Located in the host tier (spilled to the file, or dropped if the file holds them).
    OnHost,
}

/// See [`Inner::next_settling`].
enum Settling {
    Wait(Arc<Fence>),
    Now,
    Never,
}
