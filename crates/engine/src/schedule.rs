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

use crate::BufferId;
use std::collections::HashMap;

pub(crate) struct Schedule {
    steps: Vec<Vec<BufferId>>,
    /// For each buffer, the steps that use it, ascending.
    uses: HashMap<BufferId, Vec<usize>>,
    position: usize,
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
        Self { steps, uses, position: 0 }
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

    /// Drops a freed buffer from every step.
    pub fn forget(&mut self, id: BufferId) {
        if self.uses.remove(&id).is_some() {
            self.steps.iter_mut().for_each(|step| step.retain(|&b| b != id));
        }
    }
}

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
