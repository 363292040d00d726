//! The simulated device's streams and events: work runs *later*, in an order the device
//! chooses.
//!
//! Each stream is a FIFO of work (copies, memsets, event records, waits on events). Nothing
//! runs when it is enqueued. Work runs when someone needs it to (synchronising a stream or
//! an event, or a synchronous copy on the legacy stream, which first drains that stream) and,
//! at random, a few steps at every call into the device, picking among the streams whose head
//! can run. So a copy reads its source and writes its destination at some later moment, as
//! on a GPU: an engine that reuses a host slot, unmaps a chunk or hands its memory to someone
//! else before the copy's fence has completed corrupts data or faults here too.
//!
//! Events follow CUDA: a record captures the work before it on its stream; a wait captures
//! the event's most recent record at the time of the wait; an event never recorded is done.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

pub(super) enum Work {
    ToDevice { dst: u64, src: usize, len: usize },
    ToHost { dst: usize, src: u64, len: usize },
    Memset { dst: u64, value: u8, len: usize },
    Record { event: u64, generation: u64 },
    Wait { event: u64, generation: u64 },
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
    /// Whether work runs in the background at all (`background_steps`).
    background: bool,
}

impl Queues {
    pub fn new(seed: u64) -> Self {
        let mut streams = BTreeMap::new();
        streams.insert(0, VecDeque::new());
        Self { streams, events: HashMap::new(), rng: seed | 1, background: true }
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

    /// How many steps of background progress to make at this call: 0 to 2 (none while
    /// background progress is off).
    pub fn background_steps(&mut self) -> usize {
        match self.background {
            true => (self.random() % 3) as usize,
            false => 0,
        }
    }

    pub fn set_background(&mut self, on: bool) {
        self.background = on;
    }
}
