//! How a batch of moves is carried out on the driver (migrate.rs decides which, and keeps the
//! books): the bytes copied from each chunk's address into its new chunk's shadow (shadows.rs),
//! both directions at once, then the chunk's address unmapped and the new chunk mapped in its
//! place and opened, access given a run of neighbouring ranges per call. Any failure leaves
//! that chunk where it was, its bytes intact.
//!
//! Where the time goes is counted per [`Phase`] (`--stats` prints it): the VMM calls cost per
//! mapping, the copies per byte, and creating a host-located chunk most of all (~0.7 ms per
//! 2 MiB on the H200), which is why migrate.rs keeps spares.

use std::ops::Range;
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

    /// The program's addresses its copies read from, in address order.
    pub fn sources(&self) -> Vec<(u64, usize)> {
        let mut sources: Vec<(u64, usize)> = self.moves.iter().map(|m| (m.address, m.len)).collect();
        sources.sort_unstable();
        sources
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
/// Its streams must carry no copies of a later round; `busy` (address order) holds the
/// addresses the later round's copies read from.
pub fn finish(call: &str, device: &dyn Device, round: &Round, busy: &[(u64, usize)]) -> Vec<bool> {
    let started = Instant::now();
    let mut ok = round.ok.clone();
    for &stream in &round.streams {
        if let Err(why) = device.synchronize_stream(stream) {
            log(call, &format!("migration copies failed ({why})"), "the chunks stay where they were");
            ok.iter_mut().for_each(|ok| *ok = false);
        }
    }
    let started = lap(Phase::Copy, started);
    swap_all(call, device, &round.moves, &mut ok, started, busy);
    ok
}

/// Counts the time since `started` to `phase`; now.
fn lap(phase: Phase, started: Instant) -> Instant {
    let now = Instant::now();
    NANOS[phase as usize].fetch_add((now - started).as_nanos() as u64, Relaxed);
    CALLS[phase as usize].fetch_add(1, Relaxed);
    now
}

/// Whether an opening may span chunks between moved ones (`TIERMEM_OPEN_SPANS`: `allocation`,
/// the default, or `runs`: only neighbouring moved chunks, as before).
fn bridging() -> bool {
    static BRIDGE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *BRIDGE.get_or_init(|| std::env::var("TIERMEM_OPEN_SPANS").map_or(true, |v| v != "runs"))
}

/// The `cuMemSetAccess` calls that open `order`'s moves (indices into `moves`, in address
/// order): one per allocation, over the span from its first moved chunk to the end of its
/// last — every chunk between is mapped, as tiermem's allocations always are, and a call costs
/// about the same for 2 MiB as for 1 GiB (DESIGN.md), where a pause moves hundreds of chunks
/// scattered over a few allocations. A span is cut where a chunk between is being copied from
/// (`busy`, address order: the next round's copies read the program's addresses), whose
/// mapping is left alone while the copy engine reads it. With `bridge` off, only neighbouring
/// moved chunks share a call. Each: the positions in `order` it opens, its start, its bytes.
fn openings(moves: &[Move], order: &[usize], busy: &[(u64, usize)], bridge: bool) -> Vec<(Range<usize>, u64, usize)> {
    let mut out: Vec<(Range<usize>, u64, usize)> = Vec::new();
    for (at, &i) in order.iter().enumerate() {
        let m = &moves[i];
        let joins = out.last().is_some_and(|(run, start, len)| {
            let (before, end) = (&moves[order[run.end - 1]], start + *len as u64);
            let gap_busy = || {
                let from = busy.partition_point(|&(a, _)| a < end);
                busy.get(from).is_some_and(|&(a, _)| a < m.address)
            };
            end == m.address || (bridge && before.id.0 == m.id.0 && !gap_busy())
        });
        match out.last_mut() {
            Some((run, start, len)) if joins => {
                run.end = at + 1;
                *len = (m.address + m.len as u64 - *start) as usize;
            }
            _ => out.push((at..at + 1, m.address, m.len)),
        }
    }
    out
}

/// For each move still `ok`, maps `m.new` at the chunk's address in place of `m.old`, then
/// opens them, a span of the allocation per call ([`openings`]); a move that fails gets `m.old`
/// back. `busy`: the addresses copies still in flight read from.
fn swap_all(call: &str, device: &dyn Device, moves: &[Move], ok: &mut [bool], started: Instant, busy: &[(u64, usize)]) {
    for (m, ok) in moves.iter().zip(ok.iter_mut()).filter(|(_, ok)| **ok) {
        if device.unmap(m.address, m.len).is_err() {
            *ok = false;
        } else if device.map_sized(m.address, m.new, m.len).is_err() {
            put_back(call, device, m, false);
            *ok = false;
        }
    }
    let started = lap(Phase::Remap, started);
    let mut order: Vec<usize> = (0..moves.len()).filter(|&i| ok[i]).collect();
    order.sort_by_key(|&i| moves[i].address);
    for (run, start, len) in openings(moves, &order, busy, bridging()) {
        if device.set_access(start, len).is_err() {
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
    if let Err(why) = device.map_sized(m.address, m.old, m.len).and_then(|()| device.set_access(m.address, m.len)) {
        log(
            call,
            &format!("0x{:x} could not be mapped again after a failed move ({why})", m.address),
            "its bytes are safe but unreachable: the program will fault there; please report it",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(allocation: u64, index: usize) -> Move {
        let address = allocation + (index as u64) * (2 << 20);
        let handle = PhysHandle(index as u64);
        Move { id: (allocation, index), address, len: 2 << 20, old: handle, new: handle, shadow: 0, up: true }
    }

    #[test]
    fn one_opening_per_allocation_cut_where_a_copy_reads_between() {
        const A: u64 = 0x10_0000_0000;
        const B: u64 = 0x10_0100_0000; // right after A's 8 chunks
        let moves = vec![chunk(A, 0), chunk(A, 1), chunk(A, 5), chunk(B, 0), chunk(B, 3)];
        let order: Vec<usize> = (0..moves.len()).collect();
        let mib = |n: usize| n << 20;
        let spans = |busy: &[(u64, usize)], bridge| openings(&moves, &order, busy, bridge);
        // A's chunk 7 ends where B begins: neighbours join across allocations only end to end.
        assert_eq!(spans(&[], true), [(0..3, A, mib(12)), (3..5, B, mib(8))], "A 0..=5, B 0..=3");
        assert_eq!(
            spans(&[], false),
            [
                (0..2, A, mib(4)),
                (2..3, A + mib(10) as u64, mib(2)),
                (3..4, B, mib(2)),
                (4..5, B + mib(6) as u64, mib(2))
            ],
            "runs of neighbours only"
        );
        let busy = [(A + mib(12) as u64, mib(2)), (B + mib(2) as u64, mib(2))];
        assert_eq!(
            spans(&busy, true),
            [(0..3, A, mib(12)), (3..4, B, mib(2)), (4..5, B + mib(6) as u64, mib(2))],
            "A's chunk 6 lies past its last move; B's chunk 1 is being read: B is cut there"
        );
        let inside_a = [(A + mib(6) as u64, mib(2))];
        assert_eq!(spans(&inside_a, true)[..2], [(0..2, A, mib(4)), (2..3, A + mib(10) as u64, mib(2))], "A cut at 3");
    }
}
