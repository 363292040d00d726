//! The calls that steer the engine rather than move a buffer: its HBM budget (what the node
//! daemon leases), schedules (set one, record one from named passes and steps — recorder.rs —
//! or learn one from the acquires of a program that names nothing, `TIERMEM_LEARN_LOOPS`, and
//! follow it: `advance` pages ahead, schedule.rs evicts by Belady), and the peer tier (who
//! lends, how much, what is borrowed, giving it back). The calls that move data are in
//! engine.rs.

use crate::engine::{Inner, Ticket};
use crate::error::retag;
use crate::recorder::{Learned, Located, Recorder};
use crate::schedule::Schedule;
use crate::sync::MutexGuard;
use crate::{BufferId, Engine, Error, Region, Result};

/// A loop learned from acquires pages ahead at most this share of the HBM budget (`learn_from`).
const LEARNED_WINDOW_SHARE: usize = 8;

impl Engine {
    /// For tests: about one file read or write in `one_in` fails with `EIO` from now on (the
    /// same ones for the same `seed`); `None` stops it. Nothing happens without a file tier.
    /// Engine calls then fail with [`Error::File`] and, as for any I/O error, lose no byte.
    pub fn inject_file_errors(&self, one_in: Option<u64>, seed: u64) {
        if let Some(tier) = self.lock().tiers.file.as_ref() {
            tier.store.inject_errors(one_in, seed);
        }
    }

    /// Gives the HBM of idle physical chunks back to the driver (for other users of the GPU)
    /// and returns its bytes. Stale mappings of them are unmapped first; chunks brought in
    /// later are created afresh, so the next pass maps again. Data is untouched.
    pub fn release_idle_hbm(&self) -> Result<usize> {
        let mut guard = self.lock();
        let inner = &mut *guard;
        inner.tiers.reap(&mut inner.state)?;
        Ok(inner.tiers.release_idle_beyond(&mut inner.state, "release_idle_hbm", 0)? * inner.tiers.chunk)
    }

    /// Changes the HBM budget (the cap) to `bytes`, whole chunks, while the engine runs. A larger
    /// budget is used from the next page-in on. A smaller one is met without waiting: no chunk
    /// is handed out while more are in use than it allows, and the excess is sent down at once
    /// (acquired chunks as they are released) and its HBM given back to the driver as the
    /// copies land. `finish` on the ticket waits for those copies. See calls.rs ("The HBM budget").
    pub fn set_hbm_budget(&self, bytes: usize) -> Result<Ticket> {
        // Run again after a wait, the call sends down only what is not leaving yet: the fences
        // of every run make the ticket.
        let mut fences = Vec::new();
        self.unlocked_waits(|inner| inner.set_hbm_budget(bytes).map(|sent| fences.extend(sent)))?;
        self.budget_wait.tell();
        Ok(self.lock().ticket(fences))
    }

    /// From now on an acquire that fails for want of HBM (larger than the budget, or every
    /// chunk acquired) while the budget is below the engine's own cap waits up to `limit` for
    /// the budget to grow or chunks to be released, trying again at each; zero (the default):
    /// it fails at once. For engines whose budget the node daemon moves (the tenant link sets
    /// it): a newcomer's first budget, or an idle tenant's, grows once others give memory back.
    /// The wait holds no lock (budget_wait.rs).
    pub fn wait_for_budget(&self, limit: std::time::Duration) {
        self.budget_wait.set_limit(limit);
    }

    /// Tells the engine the order in which the program uses its buffers: a cycle of steps, each
    /// the buffers one step uses (e.g. one model layer each). Until [`Engine::clear_schedule`],
    /// eviction takes the chunk whose next use is furthest away (Belady), and
    /// [`Engine::advance`] pages ahead along it. The position starts at step 0. Replaces a
    /// schedule recorded by [`Engine::step_enters`] (the recorder starts afresh).
    pub fn set_schedule(&self, steps: Vec<Vec<BufferId>>) -> Result<()> {
        let mut recorder = self.recorder();
        recorder.explicit();
        recorder.forget();
        self.install_schedule("set_schedule", steps)
    }

    /// Sets `steps` as the schedule: every buffer must be live (the caller named them).
    pub(crate) fn install_schedule(&self, call: &'static str, steps: Vec<Vec<BufferId>>) -> Result<()> {
        let mut inner = self.lock();
        for &id in steps.iter().flatten() {
            inner.buffer(call, id)?;
        }
        Self::set_steps(&mut inner, call, steps)
    }

    /// Sets recorded `steps` as the schedule, without the buffers freed since they were
    /// recorded (as a freed buffer leaves a schedule already set: `Schedule::forget`).
    fn install_recorded(&self, call: &'static str, mut steps: Vec<Vec<BufferId>>) -> Result<()> {
        let mut inner = self.lock();
        for step in &mut steps {
            step.retain(|&id| inner.buffer(call, id).is_ok());
        }
        Self::set_steps(&mut inner, call, steps)
    }

    fn set_steps(inner: &mut Inner, call: &'static str, steps: Vec<Vec<BufferId>>) -> Result<()> {
        if steps.is_empty() {
            return Err(Error::Schedule { call, detail: "a schedule needs at least one step".into() });
        }
        inner.schedule = Some(Schedule::new(steps));
        inner.state.forget_streaming();
        Ok(())
    }

    /// Forgets the schedule, set or recorded: eviction goes back to the engine's policy, and
    /// the next pass (`pass_begins`) is recorded afresh.
    pub fn clear_schedule(&self) {
        let mut recorder = self.recorder();
        recorder.explicit();
        recorder.forget();
        self.lock().schedule = None;
    }

    /// Forgets the recorded schedule of the program whose steps include any of `keys` (a model
    /// taken out of a pool shared with others), keeping the other programs' (recorder.rs,
    /// "Several programs"); if it was the schedule in use, the engine has none until the next
    /// pass finds its own. Keys no schedule has are ignored.
    pub fn forget_steps(&self, keys: &[u64]) {
        let mut recorder = self.recorder();
        recorder.explicit();
        if recorder.forget_steps(keys) {
            self.lock().schedule = None;
        }
    }

    /// A pass of the program begins (a model's forward, say): for a program that does not
    /// know its schedule but repeats its steps, which it names in [`Engine::step_enters`].
    /// The first pass after this is recorded; when the next one begins, the recorded steps
    /// become the schedule (as [`Engine::set_schedule`] sets it). See recorder.rs.
    pub fn pass_begins(&self) -> Result<()> {
        let mut recorder = self.recorder();
        self.schedule_is_the_programs(&mut recorder);
        let Some(steps) = recorder.pass_begins() else { return Ok(()) };
        self.install_recorded("pass_begins", steps).inspect_err(|_| recorder.forget())
    }

    /// The program enters the step named `key` (any number the caller chooses; the same for
    /// the same step every pass), which uses `buffers`. While the first pass is recorded this
    /// only notes the step; once the schedule is known it finds the step in it and
    /// [`Engine::advance`]s there with `prefetch_bytes`, returning the step (`None` for a step
    /// the schedule does not have).
    pub fn step_enters(&self, key: u64, buffers: &[BufferId], prefetch_bytes: usize) -> Result<Option<usize>> {
        let mut recorder = self.recorder();
        self.schedule_is_the_programs(&mut recorder);
        let step = match recorder.enters(key, buffers) {
            Located::Nowhere => return Ok(None),
            Located::Step(step) => step,
            Located::Switch(steps, step) => {
                // Another program's pass (recorder.rs, "Several programs"): its schedule.
                self.install_recorded("step_enters", steps).inspect_err(|_| recorder.forget())?;
                step
            }
        };
        self.unlocked_waits(|inner| inner.advance(step, prefetch_bytes)).map_err(|e| retag(e, "step_enters"))?;
        Ok(Some(step))
    }

    /// The step the program entered last also uses `buffers`, made while it ran (a model's
    /// activations, saved for backward: `tiermem.torch.offload_activations`). While the first
    /// pass is recorded they join the step, so the schedule pages them ahead and evicts them
    /// by next use like the step's own buffers; afterwards this does nothing, and a program
    /// that uses the same buffers every pass has them in its schedule. Returns whether they
    /// were recorded.
    pub fn step_also_uses(&self, buffers: &[BufferId]) -> bool {
        self.recorder().step_also_uses(buffers)
    }

    /// The keys of the recorded schedules' steps, each schedule's in order, the one in use
    /// first (empty until a pass is recorded; several where passes of several programs are:
    /// recorder.rs, "Several programs").
    pub fn recorded_steps(&self) -> Vec<u64> {
        self.recorder().all_keys()
    }

    pub(crate) fn recorder(&self) -> MutexGuard<'_, Recorder> {
        // The recorder stays consistent across a panic: a poisoned lock is taken as it is.
        self.recorder.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Tells the engine the program is at `step` of its schedule, and starts paging in what is
    /// missing from a window of this and the coming steps, `prefetch_bytes` of them, nearest
    /// first. Evicts only chunks needed later than what it brings in, waiting for the GPU to
    /// finish with them (so a caller that advances before each step runs at the GPU's pace);
    /// never waits for the copies it starts. Returns the bytes it started copying.
    pub fn advance(&self, step: usize, prefetch_bytes: usize) -> Result<usize> {
        self.schedule_is_the_programs(&mut self.recorder());
        self.unlocked_waits(|inner| inner.advance(step, prefetch_bytes))
    }

    /// The program uses the schedule calls: a schedule learned from its acquires is dropped,
    /// and nothing more is learned (`recorder` is held: it is taken before the engine's lock).
    fn schedule_is_the_programs(&self, recorder: &mut Recorder) {
        if recorder.explicit() {
            self.lock().schedule = None;
        }
    }

    /// Learns the program's loop from an acquire of `regions` (recorder.rs, "Learning from
    /// acquires") and follows it: sets the schedule once a pass is recorded, advances along it
    /// (paging ahead `learn_loops` bytes), or clears it when it stops predicting. Nothing while
    /// `TIERMEM_LEARN_LOOPS` is off. Never fails the acquire: a schedule that cannot be set is
    /// recorded again, a page-ahead that fails leaves the acquire to bring in what it needs.
    pub(crate) fn learn_from(&self, regions: &[Region]) {
        let Some(window) = self.learn_loops else { return };
        let mut buffers: Vec<BufferId> = regions.iter().map(|r| r.buffer).collect();
        buffers.sort_unstable_by_key(|b| b.0);
        buffers.dedup();
        let key = buffers.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b.0).wrapping_mul(0x0100_0000_01b3));
        let mut recorder = self.recorder();
        let step = match recorder.acquired(key, &buffers) {
            Learned::Nothing => return,
            Learned::GiveUp => {
                self.lock().schedule = None;
                return;
            }
            Learned::Schedule(steps, step) => match self.install_recorded("acquire", steps) {
                Ok(()) => step,
                Err(_) => return recorder.forget(),
            },
            Learned::Step(step) => step,
        };
        let _ = self.unlocked_waits(|inner| {
            // Every byte of window is a byte of HBM the loop's kept set gives up: at most an
            // eighth of the budget (as tiermem.torch), so a window larger than the budget (a
            // tenant whose share shrank) does not turn Belady into streaming everything.
            let budget = inner.tiers.pool.cap() * inner.tiers.chunk;
            inner.advance(step, window.min(budget / LEARNED_WINDOW_SHARE))
        });
    }

    /// The neighbour GPUs lending to the peer tier: (GPU, bytes lent now, bytes borrowed now).
    pub fn peer_lenders(&self) -> Vec<(usize, usize, usize)> {
        let g = self.lock();
        let peer = &g.tiers.peer;
        peer.lenders().iter().map(|l| (l.gpu, peer.cap_of(l), peer.borrowed_from(l.gpu))).collect()
    }

    /// What the lender watch does every 100 ms, now: reads each lender's free memory and how
    /// busy its own kernels keep it, gives back what a lender short of memory needs, and holds
    /// the traffic of busy lenders (`TIERMEM_PEER_BUSY_RATE`). Returns the bytes given back.
    pub fn watch_lenders(&self) -> Result<usize> {
        let reserve = self.peer_reserve;
        self.lock().watch_lenders(reserve)
    }

    /// The lenders whose own work keeps them busy, as the last look found them: their traffic
    /// is held to `TIERMEM_PEER_BUSY_RATE` and they carry no page-ins from host memory.
    pub fn busy_lenders(&self) -> Vec<usize> {
        let g = self.lock();
        g.tiers.peer.lenders().iter().map(|l| l.gpu).filter(|&gpu| g.tiers.peer.is_busy(gpu)).collect()
    }

    /// Copies up to `most` chunks whose only copy is in a lender's HBM to free host room, so
    /// that the lender can take that memory back without a copy; returns how many. The lender
    /// watch does this every poll while `peer_clean` is on (movement.rs, "Cleaning borrowed chunks").
    pub fn clean_borrowed(&self, most: usize) -> Result<usize> {
        let mut guard = self.lock();
        let inner = &mut *guard;
        inner.tiers.clean_borrowed(&mut inner.state, most)
    }

    /// What GPU `gpu` lends to the peer tier becomes `bytes` (0: give everything back). Chunks
    /// in memory it no longer lends move before this returns: dropped where another copy
    /// exists, else copied to the host tier. Returns the bytes given back to the lender. It
    /// stays the most that GPU lends: the lender watch lowers what it lends when the lender
    /// is short of memory, and raises it again up to `bytes`, never beyond.
    pub fn set_peer_lending(&self, gpu: usize, bytes: usize) -> Result<usize> {
        self.lock().set_peer_lending(gpu, bytes)
    }

    /// Why GPUs of this machine do not lend to the peer tier, or a lender does not copy page-ins
    /// for this GPU (multipath), one line each, e.g. for `tiermem info`; empty when every
    /// neighbour lends and copies.
    pub fn peer_notes(&self) -> &[String] {
        &self.peer_notes
    }

    /// What the lenders could spare when the engine started, together: the most the peer tier
    /// borrows.
    pub fn peer_offered(&self) -> usize {
        self.lock().tiers.peer.lenders().iter().map(|l| l.offered).sum()
    }

    /// Borrows at most `bytes` from all lenders together from now on (the node daemon's budget
    /// of the peer tier), in whole slabs: divided evenly among them, none beyond what it
    /// offered at the start, what one cannot take going to the others. What exceeds a
    /// lender's part is given back before this returns (as [`Engine::set_peer_lending`]).
    /// Returns the bytes given back.
    pub fn set_peer_budget(&self, bytes: usize) -> Result<usize> {
        let mut inner = self.lock();
        let slab = inner.tiers.peer.slab_bytes().max(1);
        let lenders: Vec<(usize, usize)> =
            inner.tiers.peer.lenders().iter().map(|l| (l.gpu, l.offered / slab)).collect();
        let offers: Vec<usize> = lenders.iter().map(|&(_, offered)| offered).collect();
        for (&(gpu, _), part) in lenders.iter().zip(crate::lenders::divide_budget(&offers, bytes / slab)) {
            inner.tiers.peer.set_most(gpu, part * slab);
        }
        inner.reclaim_peer("set_peer_budget")
    }
}
