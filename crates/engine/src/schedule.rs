//! Known schedules: paging ahead of use, and evicting by next use.
//!
//! Many GPU programs touch their buffers in the same order every iteration: a model runs its
//! layers 0..n on every forward pass. When the program tells the engine that order
//! ([`crate::Engine::set_schedule`]: a cyclic list of steps, each the buffers one step uses)
//! and where it is in it ([`crate::Engine::advance`]), two things follow (the Bakita paper's
//! known-schedule paging; GDM's anticipatory loading):
//!
//! * **Paging ahead.** `advance` brings in the buffers of the coming steps, nearest first,
//!   until the bytes still missing or still arriving reach a budget, on the low-priority copy
//!   stream, while the program computes on the current step.
//! * **Belady eviction.** While a schedule is set, eviction picks the chunk whose next use is
//!   furthest away ([`tiermem_policy::PolicyKind::Belady`]). A loop over more layers than fit
//!   is LRU's worst case — each layer leaves just before it is needed again — whereas Belady
//!   keeps what fits resident for the whole pass and streams only the rest, so a pass moves
//!   about (bytes used − HBM) instead of everything.
//!
//! Paging ahead looks at a window of the coming steps, `prefetch_bytes` of them (resident or
//! not), and brings in what is missing there, evicting only chunks needed after the window
//! step that wants the room (a victim's next use must be strictly further away). The window
//! is counted in bytes of the schedule, not of page-ins: a budget of missing bytes would walk
//! past the resident steps and bring in chunks far ahead, each evicting the chunk just used —
//! and Belady's resident set would erode one chunk per step until everything streamed.
//! With a window of `w` chunks, a pass streams about (bytes used − HBM + `w` + the step in
//! use). Streamed chunks come back to the physical chunks they left (homes.rs), so once a
//! pass has settled, streaming makes no driver call but the copies.
//!
//! **A planned resident set.** Left to itself, Belady keeps one stretch of the pass resident
//! (from a cold start, the steps that filled HBM first; in a loop its victims are the chunks
//! just used), and while the program runs through that stretch the window holds nothing
//! missing, so the link idles unless the window is as long as the stretch — and each byte of
//! window is a byte more streamed every pass. So `advance` plans the resident set
//! (`TIERMEM_SPREAD_RESIDENT`, on by default; tiermem_policy's `spread_resident` says how):
//! shared buffers first, then the rest spread evenly along the pass, as much as HBM holds
//! beside the window and the largest streamed step. Planned buffers are evicted only after
//! every other candidate, never by paging ahead, never sent out for a home; their resident
//! chunks do not count in the window, which therefore holds streamed chunks only and runs
//! past kept steps to the next streamed ones. A pass streams about as much as before, but
//! streamed and kept steps alternate, so a short window keeps the link busy: a tied Llama's
//! trace replayed on the simulated device moved 1.03× the optimum's bytes with a 32 MiB
//! window, spread over the whole pass (1.08× in one stretch without the plan, and 1.15× at
//! the 192 MiB that window needed). The plan is made again when the HBM budget or the window
//! changes, or a buffer of the schedule is freed.
//!
//! **Looking past resident steps.** A window counted in schedule bytes has a blind spot: where
//! the steps Belady keeps resident run longer than the window (a tied model's embedding and
//! the layers kept with it), the window holds nothing missing, and the link idles until the
//! program reaches the first streamed step — measured on the H200 as a 6 ms gap in a 41 ms
//! decode step. So when the window holds nothing missing, `advance` walks on past it, until the
//! bytes missing reach the budget, and asks for the streamed chunks there as *swaps*
//! (`Purpose::Swap`). (Only then: copies past a window that still misses chunks would queue on
//! the copy stream ahead of those it needs sooner — a dense Llama decoded 9% slower so.) A
//! swap brings each chunk in only in exchange for the chunk that holds its home (homes.rs) —
//! a streamed chunk, needed later than it, clean and finished with by the GPU — or into free
//! HBM; nothing else is evicted and nothing is waited for. A swap is one chunk in for one streamed chunk out, so the resident
//! set is never eroded and a pass moves no more bytes; the copies merely start earlier.
//! Measured without the profiler, though, the decodes it was for were already link-bound
//! (tied Llama 0.82 of the PCIe bound with it, 0.81 without; MoE 0.63 and 0.66; dense 0.86 and
//! 0.88, on one H200 in one run, `bench/results/torch-20261125-e4b699d*.json`): the gap had been
//! the profiler slowing the host. So it is off unless `TIERMEM_LOOK_PAST=on`.
//!
//! **Nothing to page in.** Where every buffer of the schedule fits in HBM (a model smaller
//! than the cap, or a pass once it has settled with room to spare), a walk finds nothing
//! missing — but it walks the whole cycle to know that, since resident chunks of the plan do
//! not count in the window: each `advance` cost time in proportion to the schedule's chunks,
//! a pass in proportion to their square (112 steps of 3 buffers: 12 µs an `advance` on the
//! simulated device). A walk that went round the whole cycle and found every chunk resident
//! notes the chunk table's count of departures (`set_quiet`); until a chunk stops being
//! resident (or a buffer of the schedule is freed), `advance` has nothing to do and returns
//! at once. Chunks only become resident in between, which leaves nothing to page in.

use crate::movement::Purpose;
use crate::state::{ChunkRef, ChunkTable};
use crate::BufferId;
use std::collections::{HashMap, HashSet};
use tiermem_policy::{spread_resident, Scheduled};

pub(crate) struct Schedule {
    steps: Vec<Vec<BufferId>>,
    /// For each buffer, the steps that use it, ascending.
    uses: HashMap<BufferId, Vec<usize>>,
    position: usize,
    /// The planned resident set (tiermem_policy's `spread_resident`): buffers evicted only
    /// after every other candidate, and never sent out for a home (homes.rs).
    kept: HashSet<BufferId>,
    /// The (HBM cap, window) in chunks the plan was made for; `None`: no plan.
    planned_for: Option<(usize, usize)>,
    /// Every chunk of every step was resident when the chunk table's departures stood at
    /// this count (see "Nothing to page in" above).
    quiet: Option<u64>,
}

impl Schedule {
    pub fn new(steps: Vec<Vec<BufferId>>) -> Self {
        let mut uses: HashMap<BufferId, Vec<usize>> = HashMap::new();
        for (step, buffers) in steps.iter().enumerate() {
            for &id in buffers {
                let at = uses.entry(id).or_default();
                if at.last() != Some(&step) {
                    at.push(step);
                }
            }
        }
        Self { steps, uses, position: 0, kept: HashSet::new(), planned_for: None, quiet: None }
    }

    /// Plans which buffers stay resident for the whole pass (see "A planned resident set"
    /// above) for an HBM cap of `cap` chunks and a window of `window`, unless the plan is
    /// already for these; `chunks` gives a buffer's size.
    pub fn plan_residency(&mut self, cap: usize, window: usize, chunks: impl Fn(BufferId) -> usize) {
        if self.planned_for == Some((cap, window)) {
            return;
        }
        let mut order: Vec<(usize, BufferId)> = self.uses.iter().map(|(&id, at)| (at[0], id)).collect();
        order.sort_unstable();
        let buffers: Vec<Scheduled> =
            order.iter().map(|&(_, id)| Scheduled { chunks: chunks(id), uses: self.uses[&id].len() }).collect();
        // HBM holds the kept buffers beside the window and the largest step's streamed part:
        // a plan that streams a step larger than the window is made again with less room (the
        // room only shrinks, so this ends; a few rounds at most in practice, bounded anyway).
        let mut room = cap.saturating_sub(window + PLAN_MARGIN);
        let mut kept = HashSet::new();
        for _ in 0..PLAN_ROUNDS {
            let keep = spread_resident(&buffers, room, window);
            kept = order.iter().zip(keep).filter(|(_, k)| *k).map(|(&(_, id), _)| id).collect();
            let streamed = |ids: &Vec<BufferId>| ids.iter().filter(|id| !kept.contains(id)).map(|&id| chunks(id)).sum();
            let largest = self.steps.iter().map(streamed).max().unwrap_or(0);
            let fits = cap.saturating_sub(window.max(largest) + PLAN_MARGIN);
            if fits >= room {
                break;
            }
            room = fits;
        }
        self.kept = kept;
        self.planned_for = Some((cap, window));
    }

    /// Whether the plan keeps `id` resident for the whole pass.
    pub fn is_kept(&self, id: BufferId) -> bool {
        self.kept.contains(&id)
    }

    pub fn len(&self) -> usize {
        self.steps.len()
    }

    pub fn set_position(&mut self, step: usize) {
        debug_assert!(step < self.steps.len());
        self.position = step;
    }

    /// Steps from the current one until `id` is next used (0: the current step uses it),
    /// going round the cycle; `None` if the schedule never uses it.
    pub fn next_use(&self, id: BufferId) -> Option<u64> {
        let at = self.uses.get(&id)?;
        let n = self.steps.len();
        let next = match at.partition_point(|&s| s < self.position) {
            i if i < at.len() => at[i],
            _ => at[0] + n,
        };
        Some((next - self.position) as u64)
    }

    /// The steps from the current one onwards, once round the cycle: `(distance, buffers)`.
    pub fn ahead(&self) -> impl Iterator<Item = (u64, &[BufferId])> {
        let n = self.steps.len();
        (0..n).map(move |d| (d as u64, self.steps[(self.position + d) % n].as_slice()))
    }

    /// What paging ahead from the current step asks for, in order: for each coming step, the
    /// chunks missing within the window of `budget` bytes (`Purpose::Ahead`) and, looking past
    /// it (`look_past`), those to swap in (`Purpose::Swap`); `None` when the walk went round
    /// the whole cycle and found every chunk resident. Chunks of `g` bytes.
    pub fn window(
        &self,
        state: &ChunkTable,
        g: usize,
        budget: usize,
        look_past: bool,
    ) -> Option<Vec<(Purpose, Vec<ChunkRef>)>> {
        // The window: the coming steps, nearest first, until their chunks (resident or not)
        // reach the budget; what is missing there is brought in. Past it ("Looking past
        // resident steps" above), until the missing bytes reach the budget, streamed chunks
        // are swapped in.
        let mut plan = Vec::new();
        let (mut window, mut missing) = (0, 0);
        // Looking past: only when the window holds nothing missing, or the copies past it
        // would queue ahead of those the window needs sooner.
        let mut looking_past = None;
        for (distance, ids) in self.ahead() {
            let (mut near, mut far) = (Vec::new(), Vec::new());
            let mut cut = false;
            'buffers: for &id in ids {
                let buffer = state.buffer(id).expect("scheduled buffers are live");
                let kept = self.is_kept(id);
                for (index, chunk) in buffer.chunks().iter().enumerate() {
                    // The planned resident set stays whatever the window: its resident chunks
                    // do not count ("A planned resident set" above).
                    if kept && chunk.is_resident() {
                        continue;
                    }
                    window += g;
                    let past = window > budget;
                    if past && looking_past.is_none() {
                        looking_past = Some(look_past && missing == 0);
                    }
                    if past && (looking_past == Some(false) || missing >= budget) {
                        cut = true;
                        break 'buffers;
                    }
                    if !chunk.is_resident() {
                        missing += g;
                        if past {
                            far.push((id, index))
                        } else {
                            near.push((id, index))
                        }
                    }
                }
            }
            plan.push((Purpose::Ahead { horizon: distance }, near));
            plan.push((Purpose::Swap { horizon: distance }, far));
            if cut {
                return Some(plan);
            }
        }
        (missing > 0).then_some(plan)
    }

    /// Drops a freed buffer from every step.
    pub fn forget(&mut self, id: BufferId) {
        if self.uses.remove(&id).is_some() {
            self.steps.iter_mut().for_each(|step| step.retain(|&b| b != id));
            self.kept.remove(&id);
            self.planned_for = None;
            self.quiet = None;
        }
    }

    /// Notes that every chunk of every step is resident, the chunk table's departures
    /// standing at `departures`.
    pub fn set_quiet(&mut self, departures: u64) {
        self.quiet = Some(departures);
    }

    /// Whether every chunk of every step is still resident: none has departed since
    /// [`Schedule::set_quiet`].
    pub fn is_quiet(&self, departures: u64) -> bool {
        self.quiet == Some(departures)
    }
}

/// Chunks the plan leaves free beside the window and the largest step: chunks still
/// leaving, a buffer's chunks that do not line up with the window's count.
const PLAN_MARGIN: usize = 4;

/// Plans made at most, each with less room, until the largest streamed step fits beside the
/// kept buffers. The last one stands: at worst it keeps a little more than fits beside that
/// step, which then evicts kept buffers (last, as any eviction does).
const PLAN_ROUNDS: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_use_counts_steps_round_the_cycle() {
        let (a, b, c) = (BufferId(1), BufferId(2), BufferId(3));
        let mut s = Schedule::new(vec![vec![a], vec![b, a], vec![c]]);
        assert_eq!((s.next_use(a), s.next_use(b), s.next_use(c)), (Some(0), Some(1), Some(2)));
        s.set_position(2);
        assert_eq!((s.next_use(a), s.next_use(b), s.next_use(c)), (Some(1), Some(2), Some(0)));
        assert_eq!(s.next_use(BufferId(9)), None);
        let order: Vec<(u64, Vec<BufferId>)> = s.ahead().map(|(d, ids)| (d, ids.to_vec())).collect();
        assert_eq!(order, vec![(0, vec![c]), (1, vec![a]), (2, vec![b, a])]);
        s.forget(a);
        assert_eq!(s.next_use(a), None);
        assert_eq!(s.ahead().nth(1).map(|(_, ids)| ids.to_vec()), Some(vec![]));
    }
}
