//! The schedule recorder: a program that runs the same steps in the same order every pass (a
//! model's modules, forward then backward) says only when a pass begins and which step it
//! enters; the recorder learns the order from the first pass and from then on says where in
//! that order the program is, so the engine can evict by next use and page ahead
//! (schedule.rs) without the program writing its schedule down.
//!
//! A step is named by an opaque `u64` key chosen by the caller (`tiermem.torch` numbers its
//! modules and phases) and carries the buffers it uses.
//!
//! * **Recording.** From the first [`Recorder::pass_begins`] on, every step entered is kept,
//!   in order, with its buffers (each once). At the next `pass_begins`, if anything was
//!   recorded, the recorded steps become the schedule: `pass_begins` returns them once, for
//!   [`crate::Engine::set_schedule`]. A pass that entered no step records on.
//! * **Locating.** Once the schedule is known, [`Recorder::enters`] returns the step the
//!   program is at: the expected next step if its key matches, else the key's next use at or
//!   after the expected position, else its first use (a pass that skips or repeats steps, as
//!   generation does, finds its place again). A key the schedule never saw is not located.
//!   Each pass starts looking at step 0.
//! * **Several programs.** Two models offloaded into one pool (serving both, or a draft model
//!   beside the one it drafts for) run passes of their own, with keys of their own. A pass
//!   whose *first* step no schedule knows is another program's: it is recorded as a schedule
//!   of its own (the others are kept), and becomes the one in use when the next pass begins.
//!   A pass whose first step belongs to a schedule not in use switches to it: the step comes
//!   back as [`Located::Switch`], with that schedule's steps for the engine to set. So each
//!   model's passes page ahead along its own order, and the model that runs has Belady's
//!   order: the others' buffers, needed by none of its steps, leave first.
//!
//! * **Learning from acquires** (`TIERMEM_LEARN_LOOPS`, [`Recorder::acquired`]): for a
//!   program that never says where its passes begin, each acquire is a step (named by its
//!   buffers) and a pass begins whenever the first step ever acquired comes round again (or,
//!   if another step comes round before it, that step: the first was a one-off). The
//!   schedule is kept only while it predicts: the same buffers acquired again at once (a
//!   second kernel on them, or an acquire refused for want of room and tried again) are one
//!   step, and a pass in which fewer acquires land on the expected step than off it (or on
//!   none) ends the learning for good, and the engine goes back to its policy. A program that uses `pass_begins`/`step_enters` itself is never
//!   second-guessed.
//!
//! Invariants: the schedule is recorded once and never changes until [`Recorder::forget`];
//! `uses[key]` lists, ascending, the steps whose key is `key`; a located step is
//! `< keys.len()`. The recorder is pure (no device, no lock): the engine keeps it under its
//! own mutex, taken before the engine's lock.

use crate::BufferId;
use std::collections::HashMap;

/// Learns a program's step order from its first pass, then locates its steps in it.
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    /// The pass being recorded: `(key, buffers)` per step; `None` before the first pass and
    /// once the schedule is known.
    recording: Option<Vec<(u64, Vec<BufferId>)>>,
    /// The schedule in use; without keys until a pass has been recorded.
    current: Recorded,
    /// The other programs' schedules ("Several programs").
    others: Vec<Recorded>,
    /// A pass has begun and no step has been entered in it yet.
    fresh: bool,
    /// The step expected next.
    position: usize,
    /// Learning from acquires: the key of the first step acquired, and how the steps of the
    /// current pass were predicted.
    learning: Learning,
}

/// The state of learning a loop from acquires.
#[derive(Debug, Default)]
struct Learning {
    /// The program calls `pass_begins`/`step_enters` itself: nothing is learned.
    explicit: bool,
    /// A learned schedule failed to predict: nothing more is learned.
    gave_up: bool,
    first: Option<u64>,
    /// The key of the last acquire: the same buffers acquired again at once are the same step.
    last: Option<u64>,
    /// Acquires of this pass located at the expected step, and elsewhere or nowhere.
    hits: u32,
    misses: u32,
}

/// A recorded schedule: its steps' keys in order, each key's steps (ascending), and its
/// steps' buffers (for the engine to set it again when a switch comes back to it).
#[derive(Debug, Default)]
struct Recorded {
    keys: Vec<u64>,
    uses: HashMap<u64, Vec<usize>>,
    steps: Vec<Vec<BufferId>>,
}

/// Where an entered step is ([`Recorder::enters`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Located {
    /// Not in any schedule (or recording).
    Nowhere,
    /// This step of the schedule in use.
    Step(usize),
    /// This step of another program's schedule, which is now the one in use: set its steps.
    Switch(Vec<Vec<BufferId>>, usize),
}

impl Located {
    /// The step, wherever it was found.
    pub fn step(&self) -> Option<usize> {
        match *self {
            Located::Nowhere => None,
            Located::Step(step) | Located::Switch(_, step) => Some(step),
        }
    }
}

/// What an acquire taught the recorder ([`Recorder::acquired`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Learned {
    /// Nothing to do (recording, or not learning).
    Nothing,
    /// The first pass is recorded: set these steps as the schedule, then go to the step.
    Schedule(Vec<Vec<BufferId>>, usize),
    /// The program is at this step of the schedule.
    Step(usize),
    /// The schedule did not predict the last pass: clear it; the policy evicts from now on.
    GiveUp,
}

impl Recorder {
    /// A pass begins. Returns the schedule's steps (each the buffers it uses) when the pass
    /// that just ended was the first recorded one; the caller sets them as the schedule.
    pub fn pass_begins(&mut self) -> Option<Vec<Vec<BufferId>>> {
        let mut schedule = None;
        match self.recording.take() {
            Some(steps) if !steps.is_empty() => {
                let (keys, buffers): (Vec<u64>, Vec<Vec<BufferId>>) = steps.into_iter().unzip();
                let mut uses: HashMap<u64, Vec<usize>> = HashMap::new();
                for (step, &key) in keys.iter().enumerate() {
                    uses.entry(key).or_default().push(step);
                }
                self.put_aside();
                self.current = Recorded { keys, uses, steps: buffers.clone() };
                schedule = Some(buffers);
            }
            // Nothing recorded yet: this pass is. (With other programs' schedules only, after
            // `forget_steps`, the pass's first step says whose it is.)
            _ if self.current.keys.is_empty() && self.others.is_empty() => self.recording = Some(Vec::new()),
            _ => {}
        }
        self.position = 0;
        self.fresh = !self.current.keys.is_empty() || !self.others.is_empty();
        schedule
    }

    /// Moves the schedule in use, if any, among the others.
    fn put_aside(&mut self) {
        if !self.current.keys.is_empty() {
            self.others.push(std::mem::take(&mut self.current));
        }
    }

    /// The step `key` (using `buffers`) is entered: recorded while the first pass runs, located
    /// in the schedule once it is known. Returns the step located, if any.
    pub fn enters(&mut self, key: u64, buffers: &[BufferId]) -> Located {
        let first = std::mem::take(&mut self.fresh);
        if !self.current.uses.contains_key(&key) && first {
            if let Some(at) = self.others.iter().position(|o| o.uses.contains_key(&key)) {
                // Another program's pass: its schedule is the one in use from now on.
                let other = self.others.swap_remove(at);
                self.put_aside();
                self.current = other;
                let step = self.locate(key).expect("the key is in the schedule just set");
                return Located::Switch(self.current.steps.clone(), step);
            }
            if self.learning.explicit {
                self.recording = Some(Vec::new()); // a program no schedule knows ("Several programs")
            }
        }
        if let Some(steps) = self.recording.as_mut() {
            let mut once: Vec<BufferId> = Vec::with_capacity(buffers.len());
            for &id in buffers {
                if !once.contains(&id) {
                    once.push(id);
                }
            }
            steps.push((key, once));
            return Located::Nowhere;
        }
        self.locate(key).map_or(Located::Nowhere, Located::Step)
    }

    /// The step entered last also uses `buffers`, made while it ran (activations a model's
    /// layer saves for its backward): while the first pass is recorded they join that step,
    /// so the schedule pages them like the step's own. Once the schedule is known, nothing
    /// (a program that keeps using the same buffers finds them in it), and nothing for a loop
    /// learned from acquires, whose steps are its acquires. Returns whether they were recorded.
    pub fn step_also_uses(&mut self, buffers: &[BufferId]) -> bool {
        if !self.learning.explicit {
            return false;
        }
        let Some((_, step)) = self.recording.as_mut().and_then(|steps| steps.last_mut()) else { return false };
        for &id in buffers {
            if !step.contains(&id) {
                step.push(id);
            }
        }
        true
    }

    /// The step of the schedule in use that `key` is at, from the expected position.
    fn locate(&mut self, key: u64) -> Option<usize> {
        let uses = self.current.uses.get(&key)?;
        let expected = self.position % self.current.keys.len();
        let step = if self.current.keys[expected] == key {
            expected
        } else {
            match uses.partition_point(|&s| s < self.position) {
                i if i < uses.len() => uses[i],
                _ => uses[0],
            }
        };
        self.position = step + 1;
        Some(step)
    }

    /// The program uses the schedule calls itself: acquires teach nothing from now on, and
    /// what they taught is forgotten. Returns whether anything had been learned (the engine
    /// then drops the schedule learned, if one is set).
    pub fn explicit(&mut self) -> bool {
        if self.learning.explicit {
            return false;
        }
        let learned = self.learning.first.is_some();
        if learned {
            self.forget();
        }
        self.learning.explicit = true;
        learned
    }

    /// An acquire of `buffers` (named `key`) by a program that does not name its passes: see
    /// "Learning from acquires" above.
    pub fn acquired(&mut self, key: u64, buffers: &[BufferId]) -> Learned {
        let learning = &mut self.learning;
        if learning.explicit || learning.gave_up || learning.last.replace(key) == Some(key) {
            return Learned::Nothing;
        }
        let first = *learning.first.get_or_insert(key);
        if key == first {
            let predicted = learning.hits >= learning.misses;
            (learning.hits, learning.misses) = (0, 0);
            if !self.current.keys.is_empty() && !predicted {
                self.forget();
                self.learning.gave_up = true;
                return Learned::GiveUp;
            }
            if let Some(steps) = self.pass_begins() {
                let step = self.enters(key, buffers).step().unwrap_or(0);
                return Learned::Schedule(steps, step);
            }
        }
        if self.current.keys.is_empty() {
            let seen = self.recording.as_ref().and_then(|steps| steps.iter().position(|&(k, _)| k == key));
            if let Some(at) = seen {
                // A step comes round again before the first one did: the first was a one-off
                // (setting up), and the loop starts at this step. Its pass is recorded already.
                self.recording.as_mut().expect("recording").drain(..at);
                self.learning.first = Some(key);
                if let Some(steps) = self.pass_begins() {
                    let step = self.enters(key, buffers).step().unwrap_or(0);
                    return Learned::Schedule(steps, step);
                }
            }
            self.enters(key, buffers);
            return Learned::Nothing;
        }
        let expected = self.position % self.current.keys.len();
        let step = self.enters(key, buffers).step();
        match step {
            Some(step) if step == expected => self.learning.hits += 1,
            _ => self.learning.misses += 1,
        }
        step.map_or(Learned::Nothing, Learned::Step)
    }

    /// The keys of the schedule in use's steps, in order; empty until a pass has been recorded.
    #[cfg(test)]
    pub fn keys(&self) -> &[u64] {
        &self.current.keys
    }

    /// The keys of every schedule recorded, each schedule's in order, the one in use first.
    pub fn all_keys(&self) -> Vec<u64> {
        self.current.keys.iter().chain(self.others.iter().flat_map(|o| &o.keys)).copied().collect()
    }

    /// Forgets the schedules, in use or not, and the recording that have any of `keys` (one
    /// program's: a model taken out of a pool), keeping the other programs'. Returns whether
    /// the schedule in use was one of them (the engine then drops the schedule it set).
    pub fn forget_steps(&mut self, keys: &[u64]) -> bool {
        let named = |k: &u64| keys.contains(k);
        self.others.retain(|o| !o.keys.iter().any(named));
        if self.recording.as_ref().is_some_and(|steps| steps.iter().any(|(k, _)| named(k))) {
            self.recording = None;
        }
        let in_use = self.current.keys.iter().any(named);
        if in_use {
            self.current = Recorded::default();
        }
        in_use
    }

    /// Forgets the schedule and any recording: the next pass records afresh (who names the
    /// passes, and whether learning gave up, is kept).
    pub fn forget(&mut self) {
        let Learning { explicit, gave_up, .. } = self.learning;
        *self = Self { learning: Learning { explicit, gave_up, ..Learning::default() }, ..Self::default() };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: u64 = 10;
    const B: u64 = 11;
    const C: u64 = 12;

    fn ids(n: &[u64]) -> Vec<BufferId> {
        n.iter().map(|&i| BufferId(i)).collect()
    }

    /// Runs one pass over `keys` (each using buffer `key`) and returns the steps located.
    fn pass(r: &mut Recorder, keys: &[u64]) -> (Option<Vec<Vec<BufferId>>>, Vec<Option<usize>>) {
        let schedule = r.pass_begins();
        (schedule, keys.iter().map(|&k| r.enters(k, &ids(&[k])).step()).collect())
    }

    #[test]
    fn the_first_pass_is_recorded_and_becomes_the_schedule_at_the_next() {
        let mut r = Recorder::default();
        assert_eq!(r.enters(A, &ids(&[1])).step(), None, "nothing is recorded before the first pass");
        assert_eq!(r.pass_begins(), None);
        assert_eq!(r.enters(A, &ids(&[1, 2, 1])).step(), None);
        assert_eq!(r.enters(B, &ids(&[3])).step(), None);
        assert_eq!(r.enters(A, &ids(&[2])).step(), None);
        assert!(r.keys().is_empty(), "the schedule is not known while the pass runs");
        let schedule = r.pass_begins();
        assert_eq!(schedule, Some(vec![ids(&[1, 2]), ids(&[3]), ids(&[2])]), "buffers once per step, in order");
        assert_eq!(r.keys(), &[A, B, A]);
        assert_eq!(
            [r.enters(A, &[]).step(), r.enters(B, &[]).step(), r.enters(A, &[]).step()],
            [Some(0), Some(1), Some(2)]
        );
        let (again, located) = pass(&mut r, &[A, B, A]);
        assert_eq!((again, located), (None, vec![Some(0), Some(1), Some(2)]), "the schedule is given once");
    }

    #[test]
    fn buffers_made_during_a_recorded_step_join_it_and_nothing_after() {
        let mut r = Recorder::default();
        r.explicit();
        r.pass_begins();
        assert!(!r.step_also_uses(&ids(&[9])), "no step entered yet");
        r.enters(A, &ids(&[1]));
        assert!(r.step_also_uses(&ids(&[7, 1, 7])));
        r.enters(B, &ids(&[2]));
        assert!(r.step_also_uses(&ids(&[7])));
        assert_eq!(
            r.pass_begins(),
            Some(vec![ids(&[1, 7]), ids(&[2, 7])]),
            "each buffer once per step, after the step's own"
        );
        r.enters(A, &ids(&[1]));
        assert!(!r.step_also_uses(&ids(&[8])), "the schedule is known: nothing is recorded");
    }

    #[test]
    fn a_pass_that_entered_nothing_records_on() {
        let mut r = Recorder::default();
        assert_eq!(pass(&mut r, &[]), (None, vec![]));
        assert_eq!(pass(&mut r, &[A, B]), (None, vec![None, None]));
        assert_eq!(r.pass_begins(), Some(vec![ids(&[A]), ids(&[B])]));
    }

    #[test]
    fn a_step_off_the_expected_position_is_found_at_its_next_use_else_its_first() {
        let mut r = Recorder::default();
        pass(&mut r, &[A, B, C, B]);
        let (_, located) = pass(&mut r, &[A, B, B, C, A]);
        // The second B: step 2 (C) is expected, and B's next use from there is 3. Then C: step
        // 0 is expected and C has no use at or after 4, so its first use, 2. Then A: expected
        // 3 (B), no use of A at or after 3, so its first use, 0.
        assert_eq!(located, vec![Some(0), Some(1), Some(3), Some(2), Some(0)]);
        assert_eq!(r.enters(B, &[]).step(), Some(1));
        assert_eq!(r.enters(C, &[]).step(), Some(2));
        assert_eq!(r.enters(B, &[]).step(), Some(3));
        assert_eq!(r.enters(A, &[]).step(), Some(0), "past the last step the expected position wraps to 0");
    }

    #[test]
    fn an_unknown_key_is_not_located_and_does_not_move_the_position() {
        let mut r = Recorder::default();
        pass(&mut r, &[A, B]);
        let (_, located) = pass(&mut r, &[A, C, B]);
        assert_eq!(located, vec![Some(0), None, Some(1)]);
    }

    #[test]
    fn each_pass_starts_at_step_zero() {
        let mut r = Recorder::default();
        pass(&mut r, &[A, B, A]);
        r.pass_begins();
        assert_eq!(r.enters(B, &[]).step(), Some(1));
        // A new pass: A is expected at 0, not at 2 (its next use after the B above).
        assert_eq!(pass(&mut r, &[A]).1, vec![Some(0)]);
    }

    #[test]
    fn forget_records_afresh() {
        let mut r = Recorder::default();
        pass(&mut r, &[A]);
        assert_eq!(r.pass_begins(), Some(vec![ids(&[A])]));
        r.forget();
        assert!(r.keys().is_empty());
        assert_eq!(r.enters(A, &[]).step(), None);
        assert_eq!(pass(&mut r, &[B, C]), (None, vec![None, None]));
        assert_eq!(r.pass_begins(), Some(vec![ids(&[B]), ids(&[C])]));
        assert_eq!(r.keys(), &[B, C]);
    }

    #[test]
    fn acquires_teach_a_loop_that_is_kept_while_it_predicts() {
        let mut r = Recorder::default();
        let at = |r: &mut Recorder, k: u64| r.acquired(k, &ids(&[k]));
        for k in [A, B, C] {
            assert_eq!(at(&mut r, k), Learned::Nothing, "recording");
        }
        assert_eq!(at(&mut r, A), Learned::Schedule(vec![ids(&[A]), ids(&[B]), ids(&[C])], 0));
        assert_eq!(at(&mut r, B), Learned::Step(1));
        assert_eq!(at(&mut r, C), Learned::Step(2));
        // A pass that mostly goes elsewhere: given up for good at the next pass.
        assert_eq!(at(&mut r, A), Learned::Step(0));
        assert_eq!(at(&mut r, C), Learned::Step(2));
        assert_eq!(at(&mut r, 99), Learned::Nothing, "a key the schedule never saw");
        assert_eq!(at(&mut r, A), Learned::GiveUp);
        assert!(r.keys().is_empty());
        assert_eq!(at(&mut r, B), Learned::Nothing);
        assert_eq!(at(&mut r, A), Learned::Nothing);
    }

    #[test]
    fn a_program_that_names_its_steps_teaches_nothing_by_its_acquires() {
        let mut r = Recorder::default();
        assert!(!r.explicit(), "nothing learned yet");
        for k in [A, B, A, B] {
            assert_eq!(r.acquired(k, &ids(&[k])), Learned::Nothing);
        }
        assert!(r.keys().is_empty());
        // A program that starts naming its steps after a loop was learned: it is forgotten.
        let mut r = Recorder::default();
        for k in [A, B, A] {
            r.acquired(k, &ids(&[k]));
        }
        assert_eq!(r.keys(), &[A, B]);
        assert!(r.explicit(), "a schedule had been learned");
        assert!(r.keys().is_empty());
        assert_eq!(r.acquired(B, &ids(&[B])), Learned::Nothing);
    }

    #[test]
    fn a_one_off_first_acquire_does_not_keep_the_loop_from_being_learned() {
        let mut r = Recorder::default();
        let at = |r: &mut Recorder, k: u64| r.acquired(k, &ids(&[k]));
        for k in [99, A, B, C] {
            assert_eq!(at(&mut r, k), Learned::Nothing);
        }
        assert_eq!(at(&mut r, A), Learned::Schedule(vec![ids(&[A]), ids(&[B]), ids(&[C])], 0));
        assert_eq!(at(&mut r, B), Learned::Step(1));
        assert_eq!(at(&mut r, C), Learned::Step(2));
        assert_eq!(at(&mut r, A), Learned::Step(0), "passes begin at A now");
    }

    #[test]
    fn a_pass_that_begins_with_a_step_no_schedule_knows_is_another_programs() {
        const D: u64 = 20;
        const E: u64 = 21;
        let mut r = Recorder::default();
        r.explicit();
        pass(&mut r, &[A, B, C]);
        assert_eq!(r.pass_begins(), Some(vec![ids(&[A]), ids(&[B]), ids(&[C])]), "the first program's");
        // A second program's first pass: recorded beside the first's schedule, not located.
        for k in [D, E] {
            assert_eq!(r.enters(k, &ids(&[k])), Located::Nowhere);
        }
        assert_eq!(r.all_keys(), vec![A, B, C], "not known while its first pass runs");
        assert_eq!(r.pass_begins(), Some(vec![ids(&[D]), ids(&[E])]), "it becomes the schedule in use");
        assert_eq!(r.all_keys(), vec![D, E, A, B, C], "the first program's is kept");
        // The first program runs again: its first step switches back, with its steps to set.
        assert_eq!(r.enters(A, &[]), Located::Switch(vec![ids(&[A]), ids(&[B]), ids(&[C])], 0));
        assert_eq!([r.enters(B, &[]), r.enters(C, &[])], [Located::Step(1), Located::Step(2)]);
        r.pass_begins();
        assert_eq!(r.enters(D, &[]), Located::Switch(vec![ids(&[D]), ids(&[E])], 0));
        assert_eq!(r.enters(E, &[]), Located::Step(1));
        r.pass_begins();
        assert_eq!(r.enters(D, &[]), Located::Step(0), "the same program again: no switch");
        // Only a pass's first step switches or starts a recording: a stray step later does not.
        assert_eq!(r.enters(A, &[]), Located::Nowhere);
        assert_eq!(r.enters(99, &[]), Located::Nowhere);
        assert_eq!(r.pass_begins(), None, "nothing was recorded");
        assert_eq!(r.all_keys(), vec![D, E, A, B, C]);
        r.forget();
        assert!(r.all_keys().is_empty(), "forget forgets every program's schedule");
    }

    #[test]
    fn a_loop_learned_from_acquires_is_one_program() {
        let mut r = Recorder::default();
        let at = |r: &mut Recorder, k: u64| r.acquired(k, &ids(&[k]));
        for k in [A, B, A] {
            at(&mut r, k);
        }
        assert_eq!(at(&mut r, C), Learned::Nothing, "a key never seen is not a new program's");
        assert_eq!(r.all_keys(), vec![A, B]);
    }

    #[test]
    fn forgetting_one_programs_steps_keeps_the_others() {
        const D: u64 = 20;
        let mut r = Recorder::default();
        r.explicit();
        pass(&mut r, &[A, B]);
        pass(&mut r, &[C, D]); // A and B's schedule set; C and D's first pass recorded
        r.pass_begins(); // C and D's schedule in use, A and B's aside
        assert!(!r.forget_steps(&[A, B]), "not the schedule in use");
        assert_eq!(r.all_keys(), vec![C, D]);
        assert!(r.forget_steps(&[D]), "the schedule in use");
        assert!(r.all_keys().is_empty());
        // Nothing left: the next pass is recorded afresh.
        assert_eq!(pass(&mut r, &[A, B]).1, vec![None, None]);
        assert_eq!(r.pass_begins(), Some(vec![ids(&[A]), ids(&[B])]));
        // A program's schedule forgotten while another's is aside: that one is found again
        // at its pass's first step, and the forgotten one is recorded again.
        pass(&mut r, &[C, D]);
        r.pass_begins(); // C and D in use, A and B aside
        assert!(r.forget_steps(&[C]));
        assert_eq!(r.pass_begins(), None);
        assert_eq!(r.enters(A, &[]), Located::Switch(vec![ids(&[A]), ids(&[B])], 0));
        r.pass_begins();
        assert_eq!(r.enters(C, &ids(&[C])), Located::Nowhere, "C's pass is recorded again");
        r.enters(D, &ids(&[D]));
        assert_eq!(r.pass_begins(), Some(vec![ids(&[C]), ids(&[D])]));
        assert_eq!(r.all_keys(), vec![C, D, A, B]);
    }

    proptest::proptest! {
        /// Programs with disjoint keys (each pass the same steps, keys repeating within a pass
        /// as tied modules do) run passes in any order: once a program's first pass has been
        /// recorded and a pass has begun after it, every step of its passes is located, at a
        /// step of its own schedule with its key, switching to that schedule at its first step.
        #[test]
        fn programs_in_any_order_each_locate_their_steps_in_their_own_schedule(
            programs in proptest::collection::vec(proptest::collection::vec(0u64..6, 1..8), 1..4),
            order in proptest::collection::vec(0usize..4, 1..24),
        ) {
            let mut r = Recorder::default();
            r.explicit();
            let mut recorded = vec![false; programs.len()];
            let mut pending: Option<usize> = None; // the program whose first pass was recorded last
            let mut in_use: Option<usize> = None;
            for p in order.into_iter().map(|p| p % programs.len()) {
                let steps = &programs[p];
                let key = |k: u64| 100 * (p as u64 + 1) + k;
                let given = r.pass_begins();
                if let Some(q) = pending.take() {
                    proptest::prop_assert_eq!(given.map(|s| s.len()), Some(programs[q].len()));
                    recorded[q] = true;
                    in_use = Some(q);
                } else {
                    proptest::prop_assert!(given.is_none());
                }
                for (i, &k) in steps.iter().enumerate() {
                    let located = r.enters(key(k), &ids(&[key(k)]));
                    if !recorded[p] {
                        proptest::prop_assert_eq!(located, Located::Nowhere);
                        continue;
                    }
                    let step = located.step();
                    proptest::prop_assert!(step.is_some(), "step {} of program {} not located", i, p);
                    let switched = matches!(located, Located::Switch(..));
                    proptest::prop_assert_eq!(switched, i == 0 && in_use != Some(p), "a switch only at a pass's first step, to another program");
                    proptest::prop_assert_eq!(r.keys()[step.unwrap()], key(k));
                    in_use = Some(p);
                }
                if !recorded[p] {
                    pending = Some(p);
                }
            }
        }
    }
}
