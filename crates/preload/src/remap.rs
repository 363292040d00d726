//! How a batch of moves is carried out on the driver (migrate.rs decides which, and keeps the
//! books): the bytes copied from each chunk's address into its new chunk's shadow (shadows.rs),
//! both directions at once, then the chunk's address unmapped and the new chunk mapped in its
//! place and opened, access given a run of neighbouring ranges per call. Any failure leaves
//! that chunk where it was, its bytes intact.
//!
//! Where the time goes is counted per [`Phase`] (`--stats` prints it): the VMM calls cost per
//! mapping, the copies per byte, and creating a host-located chunk most of all (~0.7 ms per
//! 2 MiB on the H200), which is why migrate.rs keeps spares.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use tiermem_mechanism::{Device, PhysHandle, StreamHandle};

use crate::boundary::log;
use crate::hotness::ChunkId;

/// What a move's time is spent on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for the GPU before moving (the work in flight finishing).
    Wait,
    /// Creating chunks that no spare could serve (host-located, then in HBM).
    CreateHost,
    CreateHbm,
    /// Mapping new chunks at their shadows and opening them (once per chunk, shadows.rs).
    Shadows,
    /// Copying and waiting for the copies.
    Copy,
    /// Unmapping each chunk's address and mapping the new chunk there.
    Remap,
    /// Opening the remapped addresses.
    Access,
    /// Releasing chunks no longer needed.
    Release,
}

const PHASES: usize = 8;
static NANOS: [AtomicU64; PHASES] = [const { AtomicU64::new(0) }; PHASES];
static CALLS: [AtomicU64; PHASES] = [const { AtomicU64::new(0) }; PHASES];

/// Runs `f`, counting its time (and one call) to `phase`.
pub fn timed<T>(phase: Phase, f: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = f();
    NANOS[phase as usize].fetch_add(started.elapsed().as_nanos() as u64, Relaxed);
    CALLS[phase as usize].fetch_add(1, Relaxed);
    out
}

/// Per phase, in [`Phase`] order: (nanoseconds, times counted).
pub fn phases() -> [(u64, u64); PHASES] {
    std::array::from_fn(|i| (NANOS[i].load(Relaxed), CALLS[i].load(Relaxed)))
}

/// One chunk to move: its address and bytes, its physical chunk now, the one it moves to.
pub struct Move {
    pub id: ChunkId,
    pub address: u64,
    pub len: usize,
    pub old: PhysHandle,
    pub new: PhysHandle,
    /// Where `new` is mapped to be copied into (its shadow, shadows.rs).
    pub shadow: u64,
    /// Coming up to HBM (else going down to the host).
    pub up: bool,
}

/// A round of moves whose copies are enqueued ([`start`]) and not yet waited for ([`finish`]).
pub struct Round {
    pub moves: Vec<Move>,
    /// Whose copy was enqueued.
    ok: Vec<bool>,
    /// The streams its copies went on.
    streams: Vec<StreamHandle>,
}

impl Round {
    pub fn new() -> Round {
        Round { moves: Vec::new(), ok: Vec::new(), streams: Vec::new() }
    }

    pub fn is_empty(&self) -> bool {
        self.moves.is_empty()
    }

    /// The bytes of its moves up.
    pub fn bytes_up(&self) -> usize {
        self.moves.iter().filter(|m| m.up).map(|m| m.len).sum()
    }
}

/// Enqueues the copies of `moves` into their new chunks' shadows on `stream` and adds them to
/// `round`.
pub fn start(device: &dyn Device, round: &mut Round, moves: Vec<Move>, stream: StreamHandle) {
    if moves.is_empty() {
        return;
    }
    round
        .ok
        .extend(moves.iter().map(|m| device.copy_between_devices_async(m.shadow, m.address, m.len, stream).is_ok()));
    round.moves.extend(moves);
    if !round.streams.contains(&stream) {
        round.streams.push(stream);
    }
}

/// Waits for `round`'s copies, then makes each move whose every step succeeded; which did.
/// Its streams must carry no copies of a later round.
pub fn finish(call: &str, device: &dyn Device, round: &Round) -> Vec<bool> {
    let started = Instant::now();
    let mut ok = round.ok.clone();
    for &stream in &round.streams {
        if let Err(why) = device.synchronize_stream(stream) {
            log(call, &format!("migration copies failed ({why})"), "the chunks stay where they were");
            ok.iter_mut().for_each(|ok| *ok = false);
        }
    }
    let mut started = lap(Phase::Copy, started);
    if crate::verify::on() {
        for i in crate::verify::differing(call, device, &round.moves, &ok, "copied") {
            ok[i] = false;
        }
        started = Instant::now();
    }
    swap_all(call, device, &round.moves, &mut ok, started);
    if crate::verify::on() {
        for i in crate::verify::differing(call, device, &round.moves, &ok, "remapped") {
            put_back(call, device, &round.moves[i], true);
            ok[i] = false;
        }
    }
    ok
}

/// Counts the time since `started` to `phase`; now.
fn lap(phase: Phase, started: Instant) -> Instant {
    let now = Instant::now();
    NANOS[phase as usize].fetch_add((now - started).as_nanos() as u64, Relaxed);
    CALLS[phase as usize].fetch_add(1, Relaxed);
    now
}

/// Bytes from the first range's start to the last one's end.
fn span(ranges: &[(u64, usize)]) -> usize {
    ranges.last().map_or(0, |&(at, len)| (at + len as u64 - ranges[0].0) as usize)
}

/// The runs of consecutive `ranges` (`(address, bytes)`) that follow each other without a gap.
fn runs(ranges: &[(u64, usize)]) -> Vec<std::ops::Range<usize>> {
    let mut out: Vec<std::ops::Range<usize>> = Vec::new();
    for i in 0..ranges.len() {
        match out.last_mut() {
            Some(run) if ranges[i - 1].0 + ranges[i - 1].1 as u64 == ranges[i].0 => run.end += 1,
            _ => out.push(i..i + 1),
        }
    }
    out
}

/// For each move still `ok`, maps `m.new` at the chunk's address in place of `m.old`, then
/// gives access a run of neighbouring chunks per call; a move that fails gets `m.old` back.
fn swap_all(call: &str, device: &dyn Device, moves: &[Move], ok: &mut [bool], started: Instant) {
    for (m, ok) in moves.iter().zip(ok.iter_mut()).filter(|(_, ok)| **ok) {
        if device.unmap(m.address, m.len).is_err() {
            *ok = false;
        } else if device.map_sized(m.address, m.new, m.len).is_err() {
            put_back(call, device, m, false);
            *ok = false;
        }
    }
    let started = lap(Phase::Remap, started);
    // Moves in address order, so that neighbouring chunks form runs.
    let mut order: Vec<usize> = (0..moves.len()).filter(|&i| ok[i]).collect();
    order.sort_by_key(|&i| moves[i].address);
    let ranges: Vec<(u64, usize)> = order.iter().map(|&i| (moves[i].address, moves[i].len)).collect();
    for run in runs(&ranges) {
        let (start, len) = (ranges[run.start].0, span(&ranges[run.clone()]));
        if device.set_access_from(start, len, &crate::peers::access_gpus(device.info().ordinal)).is_err() {
            for &i in &order[run] {
                put_back(call, device, &moves[i], true);
                ok[i] = false;
            }
        }
    }
    lap(Phase::Access, started);
}

/// Puts `m.old` back at the chunk's address after a failed move (`mapped`: `m.new` is mapped
/// there and comes off first).
fn put_back(call: &str, device: &dyn Device, m: &Move, mapped: bool) {
    if mapped {
        let _ = device.unmap(m.address, m.len);
    }
    let gpus = crate::peers::access_gpus(device.info().ordinal);
    let mapped = device.map_sized(m.address, m.old, m.len);
    if let Err(why) = mapped.and_then(|()| device.set_access_from(m.address, m.len, &gpus)) {
        log(
            call,
            &format!("0x{:x} could not be mapped again after a failed move ({why})", m.address),
            "its bytes are safe but unreachable: the program will fault there; please report it",
        );
    }
}
