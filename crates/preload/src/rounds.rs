//! A plan's moves, made in pipelined rounds (migrate.rs decides what moves, remap.rs how one
//! round of moves is copied and remapped).
//!
//! A round sends at most a batch of chunks down and brings at most a batch up into HBM that
//! earlier rounds freed (or room the budget had), so the GPU never holds more than the budget
//! and no HBM chunk is created for them. The copies are DMA work and the remapping (unmap, map,
//! open) is the driver's work on this thread, so they overlap across rounds: a round's copies
//! are enqueued, then the round before is waited for and remapped while they run. A round's
//! copies up therefore go into HBM that the round before the round before freed: the first two
//! rounds only send chunks down (unless the budget had room), and from then on the link and the
//! driver work at once:
//!
//! ```text
//! copies   | D1 | D2 | D3 U3 | D4 U4 | ...
//! remap         | R1 | R2    | R3    | ...
//! ```
//!
//! Each round has a stream down and a stream up of its own parity, so that waiting for one
//! round's copies does not wait for the next round's. Copies up in flight count against the
//! room the budget leaves.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use tiermem_mechanism::{ChunkLocation, Device, PhysHandle, StreamHandle, StreamPriority};

use crate::boundary::log;
use crate::hotness::{self, ChunkId};
use crate::placement::Tier;
use crate::process::Process;
use crate::remap::{self, Move, Phase, Round};

static UP: AtomicU64 = AtomicU64::new(0);
static DOWN: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);
static BYTES_UP: AtomicU64 = AtomicU64::new(0);

/// Chunks moved up and down, failed moves, and bytes moved, so far.
pub fn counts() -> (u64, u64, u64, u64) {
    (UP.load(Relaxed), DOWN.load(Relaxed), FAILED.load(Relaxed), BYTES.load(Relaxed))
}

/// Bytes moved up to HBM, and down to the host, so far.
pub fn bytes_moved() -> (u64, u64) {
    let (all, up) = (BYTES.load(Relaxed), BYTES_UP.load(Relaxed));
    (up, all.saturating_sub(up))
}

/// The streams of a GPU's moves: (down, up) for rounds of each parity.
type Streams = [(StreamHandle, StreamHandle); 2];

/// What moving keeps per GPU between quiesce points.
#[derive(Default)]
pub struct Tools {
    streams: Option<Streams>,
    /// Host chunks, unmapped, ready to take a chunk of their size going down: (bytes, handle).
    spares: Vec<(usize, PhysHandle)>,
}

impl Tools {
    /// Gives back the spare chunks and the streams (the GPU's last allocation was freed).
    pub fn release(self, device: &dyn Device, p: &mut Process) {
        for (_, spare) in self.spares {
            p.shadows.forget(device, spare);
            let _ = crate::spill::release(device, spare);
        }
        for (down, up) in self.streams.into_iter().flatten() {
            let _ = (device.destroy_stream(down), device.destroy_stream(up));
        }
    }

    /// The bytes of host chunks kept ready to take chunks going down.
    pub fn spare_bytes(&self) -> usize {
        self.spares.iter().filter(|&&(_, h)| !crate::spill::is_lent(h)).map(|&(len, _)| len).sum()
    }

    /// Keeps `handle`, a host chunk of `len` bytes made ahead of need (spares.rs), for moves down.
    pub fn add_spare(&mut self, len: usize, handle: PhysHandle) {
        self.spares.push((len, handle));
    }

    fn streams(&mut self, device: &dyn Device) -> Result<Streams, String> {
        if let Some(made) = self.streams {
            return Ok(made);
        }
        let mut made = Vec::new();
        for _ in 0..4 {
            match device.create_stream(StreamPriority::High) {
                Ok(stream) => made.push(stream),
                Err(why) => {
                    made.into_iter().for_each(|s| drop(device.destroy_stream(s)));
                    return Err(why.to_string());
                }
            }
        }
        Ok(*self.streams.insert([(made[0], made[1]), (made[2], made[3])]))
    }
}

/// Takes a chunk of `len` bytes out of `pool` (`(bytes, handle)` pairs), if one is there.
fn take(pool: &mut Vec<(usize, PhysHandle)>, len: usize) -> Option<PhysHandle> {
    take_if(pool, len, |_| true)
}

/// Takes a chunk of `len` bytes out of `pool` for which `wanted` holds, if one is there.
fn take_if(pool: &mut Vec<(usize, PhysHandle)>, len: usize, wanted: impl Fn(PhysHandle) -> bool) -> Option<PhysHandle> {
    let at = pool.iter().rposition(|&(bytes, handle)| bytes == len && wanted(handle))?;
    Some(pool.swap_remove(at).1)
}

/// Moves `downs` to the host and `ups` to HBM on GPU `ordinal`, in pipelined rounds of at most
/// `batch` each way (module documentation); the addresses of the chunks that moved. A chunk
/// whose move fails stays where it was.
pub fn execute(
    call: &str,
    p: &mut Process,
    ordinal: usize,
    downs: &[ChunkId],
    ups: &[ChunkId],
    tools: &mut Tools,
    batch: usize,
) -> Vec<u64> {
    let Some(gpu) = p.gpus.get(&ordinal) else { return Vec::new() };
    let Some(device) = gpu.device.clone() else { return Vec::new() };
    let device = device.as_ref();
    let streams = match tools.streams(device) {
        Ok(made) => made,
        Err(why) => {
            log(call, &format!("no streams to copy on ({why})"), "nothing moved");
            return Vec::new();
        }
    };
    let (mut downs, mut ups) = (downs.iter().copied().peekable(), ups.iter().copied().peekable());
    let mut freed_hbm = Vec::new();
    let mut moved = Vec::new();
    let mut pending: Option<Round> = None;
    for parity in (0..2).cycle() {
        // This round's copies go at once: down, and up into HBM that finished rounds freed.
        let mut round = Round::new();
        let (down, up) = streams[parity];
        let going_down = take_downs(call, (device, ordinal), p, &mut downs, &mut tools.spares, batch);
        remap::start(device, &mut round, going_down, down);
        let in_flight = pending.as_ref().map_or(0, Round::bytes_up);
        let coming_up = take_ups(call, device, p, (ordinal, in_flight), &mut ups, &mut freed_hbm, batch);
        remap::start(device, &mut round, coming_up, up);
        // The round before is remapped while they run; it frees the HBM its chunks left.
        let finished = pending.take().map(|before| {
            moved.extend(finish(call, device, p, ordinal, &before, &mut tools.spares, &mut freed_hbm));
        });
        if !round.is_empty() {
            pending = Some(round);
        } else if finished.is_none() {
            break;
        }
    }
    // Spares are kept up to what could go down at once (the HBM in use): a chunk coming up
    // frees one, a chunk going down takes one, so the host memory they hold stays bounded by
    // the peak the program had there.
    let hbm_used = p.gpus.get(&ordinal).map_or(0, |g| g.hbm_used);
    let mut kept = 0;
    let (keep, extra): (Vec<_>, Vec<_>) = tools.spares.drain(..).partition(|&(len, _)| {
        kept += len;
        kept <= hbm_used
    });
    tools.spares = keep;
    for (_, handle) in freed_hbm.into_iter().chain(extra) {
        release(device, p, handle);
    }
    moved
}

/// Gives `lender` (a neighbour that ran short of its reserve: spill.rs) up to `bytes` of what it
/// lent GPU `ordinal`: its chunks among the spares released, then chunks in use moved to the
/// host at their addresses (copied and remapped as a move down is, in rounds of `batch`; the
/// books' HBM untouched). Called at a quiesce point, like every move. The bytes given back.
pub fn return_lent(
    call: &str,
    p: &mut Process,
    ordinal: usize,
    (lender, bytes): (usize, usize),
    tools: &mut Tools,
    batch: usize,
) -> usize {
    let Some(device) = p.gpus.get(&ordinal).and_then(|gpu| gpu.device.clone()) else { return 0 };
    let device = device.as_ref();
    let mut returned = 0;
    while returned < bytes {
        let Some(at) = tools.spares.iter().position(|&(_, h)| crate::spill::lender_of(h) == Some(lender)) else {
            break;
        };
        let (len, handle) = tools.spares.swap_remove(at);
        release(device, p, handle);
        returned += len;
    }
    let Ok(streams) = tools.streams(device) else { return returned };
    let mut owed: Vec<ChunkId> = Vec::new();
    let mut covered = returned;
    for allocation in p.books.iter().chain(p.books.kept()) {
        for (index, &(handle, _)) in allocation.chunks.iter().enumerate() {
            if covered < bytes && crate::spill::lender_of(handle) == Some(lender) {
                owed.push((allocation.va, index));
                covered += allocation.chunk_len(index);
            }
        }
    }
    for ids in owed.chunks(batch.max(1)) {
        let mut moves = Vec::new();
        for &id in ids {
            let Some((address, len, old)) = find(p, id) else { continue };
            let host = take_if(&mut tools.spares, len, |h| !crate::spill::is_lent(h));
            let Some(new) = host.or_else(|| create(device, ChunkLocation::Host, len)) else { break };
            let Some(shadow) = shadow(call, device, p, new, len) else {
                tools.spares.push((len, new));
                break;
            };
            moves.push(Move { id, address, len, old, new, shadow, up: false });
        }
        let mut round = Round::new();
        remap::start(device, &mut round, moves, streams[0].0);
        for (m, made) in round.moves.iter().zip(remap::finish(call, device, &round)) {
            FAILED.fetch_add(u64::from(!made), Relaxed);
            if !made {
                tools.spares.push((m.len, m.new));
                continue;
            }
            if let Some(slot) = p.books.movable_mut(m.id.0).and_then(|(a, _)| a.chunks.get_mut(m.id.1)) {
                slot.0 = m.new;
            }
            release(device, p, m.old);
            returned += m.len;
        }
    }
    returned
}

/// Gives physical chunk `handle` back to the driver, its shadow first.
fn release(device: &dyn Device, p: &mut Process, handle: PhysHandle) {
    remap::timed(Phase::Release, || {
        p.shadows.forget(device, handle);
        let _ = crate::spill::release(device, handle);
    });
}

/// The chunk's address, bytes and physical chunk now, while it is in the books (live, or a
/// free kept mapped: deferred.rs).
fn find(p: &Process, (va, index): ChunkId) -> Option<(u64, usize, PhysHandle)> {
    p.books
        .movable(va)
        .filter(|a| index < a.chunks.len())
        .map(|a| (a.chunk_va(index), a.chunk_len(index), a.chunks[index].0))
}

/// Where a new chunk is copied into: its shadow, made the first time (shadows.rs).
fn shadow(call: &str, device: &dyn Device, p: &mut Process, handle: PhysHandle, len: usize) -> Option<u64> {
    remap::timed(Phase::Shadows, || p.shadows.of(device, handle, len))
        .map_err(|why| {
            FAILED.fetch_add(1, Relaxed);
            log(call, &format!("a chunk could not be mapped to be copied into ({why})"), "it stays where it is")
        })
        .ok()
}

fn create(device: &dyn Device, location: ChunkLocation, len: usize) -> Option<PhysHandle> {
    let phase = if location == ChunkLocation::Host { Phase::CreateHost } else { Phase::CreateHbm };
    let granules = len / device.info().granularity.max(1);
    remap::timed(phase, || crate::ipc::create_chunk(device, location, granules).ok())
}

/// Up to `batch` moves down from GPU `ordinal`'s HBM, into a neighbour's HBM where one lends
/// room (spill.rs), else into spare host chunks or new ones.
fn take_downs(
    call: &str,
    (device, ordinal): (&dyn Device, usize),
    p: &mut Process,
    downs: &mut impl Iterator<Item = ChunkId>,
    spares: &mut Vec<(usize, PhysHandle)>,
    batch: usize,
) -> Vec<Move> {
    let mut moves = Vec::new();
    while moves.len() < batch {
        let Some(id) = downs.next() else { break };
        let Some((address, len, old)) = find(p, id) else { continue };
        // A neighbour's room first, where one lends (asked only then: this runs per chunk).
        let lent = |spares: &mut Vec<(usize, PhysHandle)>| {
            take_if(spares, len, crate::spill::is_lent)
                .or_else(|| remap::timed(Phase::CreateHbm, || crate::spill::create_lent(device, ordinal, len)))
        };
        let new = crate::spill::lending()
            .then(|| lent(spares))
            .flatten()
            .or_else(|| take(spares, len))
            .or_else(|| create(device, ChunkLocation::Host, len));
        let Some(new) = new else { break };
        let Some(shadow) = shadow(call, device, p, new, len) else {
            spares.push((len, new));
            break;
        };
        moves.push(Move { id, address, len, old, new, shadow, up: false });
    }
    moves
}

/// Up to `batch` moves up, into HBM that earlier rounds freed or new chunks, as far as the
/// budget has room beyond the `in_flight` bytes of a round's moves up not yet made; a new
/// chunk also counts the freed ones still held, so the GPU never holds more than the budget.
fn take_ups(
    call: &str,
    device: &dyn Device,
    p: &mut Process,
    (ordinal, in_flight): (usize, usize),
    ups: &mut std::iter::Peekable<impl Iterator<Item = ChunkId>>,
    freed_hbm: &mut Vec<(usize, PhysHandle)>,
    batch: usize,
) -> Vec<Move> {
    let mut moves = Vec::new();
    let mut room = p.gpus.get(&ordinal).map_or(0, |g| g.budget.saturating_sub(g.hbm_used).saturating_sub(in_flight));
    while moves.len() < batch {
        let Some(&id) = ups.peek() else { break };
        let Some((address, len, old)) = find(p, id) else {
            ups.next();
            continue;
        };
        if len > room {
            break;
        }
        let new = match take(freed_hbm, len) {
            Some(freed) => freed,
            None => {
                // A new chunk: the freed ones (none of this size) still hold HBM, so as many go
                // back to the driver as the budget needs (the end of the moves would anyway).
                while len + freed_hbm.iter().map(|&(bytes, _)| bytes).sum::<usize>() > room {
                    let Some((_, handle)) = freed_hbm.pop() else { break };
                    release(device, p, handle);
                }
                if len + freed_hbm.iter().map(|&(bytes, _)| bytes).sum::<usize>() > room {
                    break;
                }
                let Some(made) = create(device, ChunkLocation::Gpu(ordinal), len) else { break };
                made
            }
        };
        let Some(shadow) = shadow(call, device, p, new, len) else {
            freed_hbm.push((len, new));
            break;
        };
        ups.next();
        room -= len;
        moves.push(Move { id, address, len, old, new, shadow, up: true });
    }
    moves
}

/// Finishes `round` (remap.rs) and settles the books of each move made; the chunks left behind
/// go to the spares (host) or the freed HBM. The addresses of the chunks that moved.
fn finish(
    call: &str,
    device: &dyn Device,
    p: &mut Process,
    ordinal: usize,
    round: &Round,
    spares: &mut Vec<(usize, PhysHandle)>,
    freed_hbm: &mut Vec<(usize, PhysHandle)>,
) -> Vec<u64> {
    let mut addresses = Vec::new();
    for (m, made) in round.moves.iter().zip(remap::finish(call, device, round)) {
        FAILED.fetch_add(u64::from(!made), Relaxed);
        // The chunk left behind: the old one if the move was made, else the new one.
        let left = if made { m.old } else { m.new };
        let host_chunk_left = m.up == made;
        (if host_chunk_left { &mut *spares } else { &mut *freed_hbm }).push((m.len, left));
        if made {
            settle(p, ordinal, m, if m.up { Tier::Hbm } else { Tier::Host });
            addresses.push(m.address);
        }
    }
    addresses
}

/// The books after move `m` to `tier` succeeded: the chunk's handle and tier, the budget, and
/// the statistics of the program's allocations if it is live (a kept free counts against the
/// budget, not among them).
fn settle(p: &mut Process, ordinal: usize, m: &Move, tier: Tier) {
    let mut live = false;
    if let Some((allocation, is_live)) = p.books.movable_mut(m.id.0) {
        if let Some(slot) = allocation.chunks.get_mut(m.id.1) {
            *slot = (m.new, tier);
        }
        live = is_live;
    }
    if let Some(gpu) = p.gpus.get_mut(&ordinal) {
        gpu.hbm_used = if tier == Tier::Hbm { gpu.hbm_used + m.len } else { gpu.hbm_used.saturating_sub(m.len) };
    }
    if live {
        p.stats.moved(m.len, tier == Tier::Hbm);
    }
    hotness::moved(m.id.0, m.id.1, tier == Tier::Host);
    (if tier == Tier::Hbm { &UP } else { &DOWN }).fetch_add(1, Relaxed);
    BYTES.fetch_add(m.len as u64, Relaxed);
    if tier == Tier::Hbm {
        BYTES_UP.fetch_add(m.len as u64, Relaxed);
    }
}
