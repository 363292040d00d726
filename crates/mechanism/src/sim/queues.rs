//! The simulated device's streams and events: work runs *later*, in an order the device
//! chooses.
//!
//! Each stream is a FIFO of work (copies, memsets, event records, waits on events). Nothing
//! runs when it is enqueued. Work runs when someone needs it to (synchronising a stream or
//! an event, or a synchronous copy on the legacy stream, which first drains that stream) and,
//! depending on the [`Timing`], a few steps at calls into the device, picking at random among
//! the streams whose head can run. So a copy reads its source and writes its destination at
//! some later moment, as on a GPU: an engine that reuses a host slot, unmaps a chunk or hands
//! its memory to someone else before the copy's fence has completed corrupts data or faults
//! here too.
//!
//! A wait runs only what it needs: the head of the stream waited for or, when that head waits
//! for an event, the stream that will record it, followed down the chain ([`Queues::blocker`]).
//! Work nobody waits for stays queued, however old — with [`Timing::Lazy`] for ever, which is
//! the slowest GPU allowed: a missing wait then shows every time rather than by chance.
//!
//! Events follow CUDA: a record captures the work before it on its stream; a wait captures
//! the event's most recent record at the time of the wait; an event never recorded is done.

use super::work::Op;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

/// When queued work runs on the simulated device, besides when someone waits for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timing {
    /// A few steps (0 to 2) at most calls into the device: a fast GPU.
    Eager,
    /// Never: work runs only when waited for, and then only what the wait needs.
    Lazy,
    /// Rarely and in bursts (on average one call in four runs 1 to 3 steps): a GPU that
    /// falls behind, so fences complete late and streams overtake each other.
    Random,
}

impl Timing {
    pub const ALL: [Timing; 3] = [Timing::Eager, Timing::Lazy, Timing::Random];
}

pub(super) enum Work {
    /// Copies, memsets and kernels ([`Op`]), run by GPU `gpu`: the memory they touch must
    /// be accessible from it when they run.
    Memory {
        gpu: usize,
        op: Op,
    },
    Record {
        event: u64,
        generation: u64,
    },
    Wait {
        event: u64,
        generation: u64,
    },
}

#[derive(Default)]
struct EventState {
    generation: u64,
    pending: HashSet<u64>,
}

pub(super) struct Queues {
    streams: BTreeMap<u64, VecDeque<Work>>,
    events: HashMap<u64, EventState>,
    rng: u64,
    /// When work runs in the background (`background_steps`).
    timing: Timing,
}

impl Queues {
    pub fn new(seed: u64) -> Self {
        let mut streams = BTreeMap::new();
        streams.insert(0, VecDeque::new());
        Self { streams, events: HashMap::new(), rng: seed | 1, timing: Timing::Eager }
    }

    /// Streams and events the user created (the legacy stream 0 is not counted).
    pub fn live(&self) -> (usize, usize) {
        (self.streams.len() - 1, self.events.len())
    }

    pub fn add_stream(&mut self, id: u64) {
        self.streams.insert(id, VecDeque::new());
    }

    pub fn has_stream(&self, id: u64) -> bool {
        self.streams.contains_key(&id)
    }

    pub fn remove_stream(&mut self, id: u64) -> bool {
        id != 0 && self.streams.remove(&id).is_some()
    }

    pub fn add_event(&mut self, id: u64) {
        self.events.insert(id, EventState::default());
    }

    pub fn has_event(&self, id: u64) -> bool {
        self.events.contains_key(&id)
    }

    pub fn remove_event(&mut self, id: u64) -> bool {
        self.events.remove(&id).is_some()
    }

    pub fn enqueue(&mut self, stream: u64, work: Work) {
        self.streams.get_mut(&stream).expect("stream checked by the caller").push_back(work);
    }

    pub fn record(&mut self, event: u64, stream: u64) {
        let state = self.events.get_mut(&event).expect("event checked by the caller");
        state.generation += 1;
        let generation = state.generation;
        state.pending.insert(generation);
        self.enqueue(stream, Work::Record { event, generation });
    }

    pub fn wait(&mut self, stream: u64, event: u64) {
        let generation = self.events[&event].generation;
        self.enqueue(stream, Work::Wait { event, generation });
    }

    pub fn event_done(&self, event: u64) -> bool {
        let state = &self.events[&event];
        !state.pending.contains(&state.generation)
    }

    pub fn stream_idle(&self, stream: u64) -> bool {
        self.streams.get(&stream).is_none_or(|q| q.is_empty())
    }

    /// The stream that will record `generation` of `event`, if it is still queued.
    fn recorder(&self, event: u64, generation: u64) -> Option<u64> {
        self.streams.iter().find_map(|(&id, q)| {
            q.iter()
                .any(|w| matches!(w, Work::Record { event: e, generation: g } if *e == event && *g == generation))
                .then_some(id)
        })
    }

    /// The stream whose head must run next for `stream`'s head to run: `stream` itself, or,
    /// when its head waits for an event not yet recorded, the stream that records it, followed
    /// down the chain. `None` if `stream` is idle or its wait can never be satisfied.
    pub fn blocker(&self, mut stream: u64) -> Option<u64> {
        loop {
            match self.streams.get(&stream)?.front()? {
                Work::Wait { event, generation } if !self.satisfied(*event, *generation) => {
                    stream = self.recorder(*event, *generation)?;
                }
                _ => return Some(stream),
            }
        }
    }

    /// The stream whose head must run next for `event`'s latest record to complete.
    pub fn event_blocker(&self, event: u64) -> Option<u64> {
        let generation = self.events.get(&event)?.generation;
        self.blocker(self.recorder(event, generation)?)
    }

    fn satisfied(&self, event: u64, generation: u64) -> bool {
        self.events.get(&event).is_none_or(|s| !s.pending.contains(&generation))
    }

    fn runnable(&self) -> Vec<u64> {
        self.streams
            .iter()
            .filter(|(_, q)| match q.front() {
                None => false,
                Some(Work::Wait { event, generation }) => self.satisfied(*event, *generation),
                Some(_) => true,
            })
            .map(|(&id, _)| id)
            .collect()
    }

    fn random(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// Pops the head of `stream` (or of a random stream whose head can run) if it can run.
    /// Records and waits complete here (`Some(None)`); memory work is returned for the
    /// caller to perform. `None`: nothing could run.
    pub fn pop(&mut self, stream: Option<u64>) -> Option<Option<Work>> {
        let runnable = self.runnable();
        let stream = match stream {
            Some(s) => runnable.contains(&s).then_some(s)?,
            None if runnable.is_empty() => return None,
            None => runnable[(self.random() % runnable.len() as u64) as usize],
        };
        Some(match self.streams.get_mut(&stream)?.pop_front()? {
            Work::Record { event, generation } => {
                if let Some(state) = self.events.get_mut(&event) {
                    state.pending.remove(&generation);
                }
                None
            }
            Work::Wait { .. } => None,
            work => Some(work),
        })
    }

    /// How many steps of background progress to make at this call (see [`Timing`]).
    pub fn background_steps(&mut self) -> usize {
        match self.timing {
            Timing::Eager => (self.random() % 3) as usize,
            Timing::Lazy => 0,
            Timing::Random => match self.random() % 4 {
                0 => 1 + (self.random() % 3) as usize,
                _ => 0,
            },
        }
    }

    pub fn set_seed(&mut self, seed: u64) {
        self.rng = seed | 1;
    }

    pub fn set_timing(&mut self, timing: Timing) {
        self.timing = timing;
    }
}
