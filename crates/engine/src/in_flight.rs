//! The index of work in flight that the engine must come back to: chunks moving down (they
//! leave HBM when their fence completes), host and peer slots still read by a copy (freed
//! when it completes) and demand copies being timed (their device time is added to the stall
//! counter). `reap` collects what has completed; a call that must wait asks here for the next
//! fence to wait on. Nothing here waits.

use crate::fence::Fence;
use crate::state::{Below, ChunkRef};
use crate::sync::Arc;
use std::collections::VecDeque;
use tiermem_mechanism::{PhysHandle, Result};

/// A group of chunks moving down behind one fence.
pub(crate) struct PendingDown {
    pub fence: Arc<Fence>,
    pub chunks: Vec<ChunkRef>,
}

#[derive(Default)]
pub(crate) struct InFlight {
    down: Vec<PendingDown>,
    retiring: VecDeque<(Arc<Fence>, Below)>,
    timed: VecDeque<(Arc<Fence>, Arc<Fence>)>,
    /// Physical chunks handed over by chunks still moving down (hand_overs.rs):
    /// free to take, but a copy into one waits for its fence.
    handed: Vec<(Arc<Fence>, PhysHandle)>,
    /// The moves down of every chunk handed over, until done: the next hand-over waits for
    /// them (hand_overs.rs, "Pacing").
    handed_moves: Vec<(Arc<Fence>, usize)>,
}

impl InFlight {
    /// `chunks` move down behind `fence`.
    pub fn moving_down(&mut self, fence: Arc<Fence>, chunks: Vec<ChunkRef>) {
        self.down.push(PendingDown { fence, chunks });
    }

    /// How many chunks are moving down (a chunk sent down twice behind two fences counts twice).
    pub fn chunks_moving_down(&self) -> usize {
        self.down.iter().map(|group| group.chunks.len()).sum()
    }

    /// The chunks moving down, oldest group first as far as the index keeps order (a chunk
    /// sent down twice is listed twice).
    pub fn chunks_moving(&self) -> impl Iterator<Item = ChunkRef> + '_ {
        self.down.iter().flat_map(|group| group.chunks.iter().copied())
    }

    /// The groups whose move down has completed, taken out of the index.
    pub fn landed(&mut self) -> Result<Vec<PendingDown>> {
        let mut landed = Vec::new();
        let mut i = 0;
        while i < self.down.len() {
            if self.down[i].fence.is_done()? {
                landed.push(self.down.swap_remove(i));
            } else {
                i += 1;
            }
        }
        Ok(landed)
    }

    /// The fence of a move down still in flight, if any.
    pub fn next_landing(&self) -> Option<&Arc<Fence>> {
        self.down.first().map(|group| &group.fence)
    }

    /// `slot` is freed once `reader` (a copy from it) has completed.
    pub fn retire(&mut self, reader: Arc<Fence>, slot: Below) {
        self.retiring.push_back((reader, slot));
    }

    /// The retired slots whose readers have completed, taken out of the index, oldest first.
    pub fn retired(&mut self) -> Result<Vec<Below>> {
        let mut slots = Vec::new();
        while let Some((fence, _)) = self.retiring.front() {
            if !fence.is_done()? {
                break;
            }
            slots.extend(self.retiring.pop_front().map(|(_, slot)| slot));
        }
        Ok(slots)
    }

    /// The fence after which the oldest retired slot is free.
    pub fn next_retired(&self) -> Option<&Arc<Fence>> {
        self.retiring.front().map(|(fence, _)| fence)
    }

    /// How many slots wait for their readers.
    pub fn retiring(&self) -> usize {
        self.retiring.len()
    }

    /// Every retired slot, whatever its reader (shutdown, after every stream is synchronised).
    pub fn drain_retiring(&mut self) -> Vec<Below> {
        self.timed.clear();
        self.handed.clear();
        self.handed_moves.clear();
        self.retiring.drain(..).map(|(_, slot)| slot).collect()
    }

    /// `phys` is free to take, but the copy down that reads it ends only with `fence`.
    pub fn hand_over(&mut self, fence: Arc<Fence>, phys: PhysHandle) {
        match self.handed_moves.iter_mut().find(|(f, _)| Arc::ptr_eq(f, &fence)) {
            Some((_, chunks)) => *chunks += 1,
            None => self.handed_moves.push((Arc::clone(&fence), 1)),
        }
        self.handed.push((fence, phys));
    }

    /// The oldest moves down of chunks handed over that are still running, as many as leave
    /// at most `ahead` chunks handed over by the others (those done are forgotten).
    pub fn handed_moves_beyond(&mut self, ahead: usize) -> Result<Vec<Arc<Fence>>> {
        let mut running = Vec::with_capacity(self.handed_moves.len());
        for (fence, chunks) in self.handed_moves.drain(..) {
            if !fence.is_done()? {
                running.push((fence, chunks));
            }
        }
        self.handed_moves.clone_from(&running);
        let mut total: usize = running.iter().map(|&(_, chunks)| chunks).sum();
        let mut oldest = Vec::new();
        for (fence, chunks) in running {
            if total <= ahead {
                break;
            }
            total -= chunks;
            oldest.push(fence);
        }
        Ok(oldest)
    }

    /// The fences, not yet done, that copies into `phys` must wait for; they are forgotten here
    /// (the caller's copies wait for them).
    pub fn take_handed(&mut self, phys: &[PhysHandle]) -> Result<Vec<Arc<Fence>>> {
        let mut fences: Vec<Arc<Fence>> = Vec::new();
        let mut i = 0;
        while i < self.handed.len() {
            let (fence, p) = &self.handed[i];
            if fence.is_done()? {
                self.handed.swap_remove(i);
            } else if phys.contains(p) {
                if !fences.iter().any(|f| Arc::ptr_eq(f, fence)) {
                    fences.push(Arc::clone(fence));
                }
                self.handed.swap_remove(i);
            } else {
                i += 1;
            }
        }
        Ok(fences)
    }

    /// Whether a copy down may still read `phys` (handed over): not to be given back to the
    /// driver yet.
    pub fn still_read(&self, phys: PhysHandle) -> bool {
        self.handed.iter().any(|(fence, p)| *p == phys && !matches!(fence.is_done(), Ok(true)))
    }

    /// A demand copy between `start` and `end`, to be added to the stall time.
    pub fn time(&mut self, start: Arc<Fence>, end: Arc<Fence>) {
        self.timed.push_back((start, end));
    }

    /// Milliseconds of device time of the timed copies that have completed, taken out.
    pub fn timed_ms(&mut self) -> Result<f64> {
        let mut ms = 0.0;
        while let Some((start, end)) = self.timed.front() {
            if !end.is_done()? {
                break;
            }
            ms += f64::from(end.elapsed_since(start)?);
            self.timed.pop_front();
        }
        Ok(ms)
    }
}
