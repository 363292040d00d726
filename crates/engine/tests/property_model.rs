//! Random sequences of alloc / write / acquire / release / prefetch / page_out / page_in /
//! exchange / free / discard (property/ops.rs) against a reference model (a `Vec<u8>` per buffer). Every byte read back — through
//! `Engine::read` or through the device pointer while acquired — must equal the model, after
//! any sequence of moves; errors must be the documented ones and change no byte.
//!
//! Tiny caps (8 HBM chunks, 24 host chunks, up to 8 buffers of up to 5 chunks) force constant eviction. 500 cases × 100 ops by
//! default (`PROPTEST_CASES` scales it); `TIERMEM_TEST_BACKEND=cuda` runs it on a real GPU.
//! On the simulated device each case runs with one of its timings (eager, lazy, random:
//! `tiermem::mechanism::sim::Timing`), picked by the case; `TIERMEM_TEST_TIMING` forces one.

mod support;

use proptest::prelude::*;
use support::{pattern, CHUNK};
use tiermem::{Access, AllocOptions, BufferId, Engine, EngineConfig, Error, Region, StreamHandle, Target, Ticket};

#[path = "property/ops.rs"]
mod ops;
use ops::{op, Op};

struct Model {
    /// Bytes of the engine's chunk (`EngineConfig::chunk`: one granule, or several).
    chunk: usize,
    /// Chunks the tiers below HBM hold: the host tier, plus the file tier if there is one.
    spill_chunks: usize,
    has_file: bool,
    /// GPUs 1 and 2 lend to a peer tier.
    has_peers: bool,
    buffers: Vec<(BufferId, Vec<u8>, bool)>,
    holds: Vec<(Region, Access)>,
    tickets: Vec<Ticket>,
    /// Driver calls and file I/O fail at random (`SimDevice::inject_errors`,
    /// `Engine::inject_file_errors`): a device or file error is then a legitimate outcome of
    /// any call, and must change no byte.
    injecting: bool,
    /// Buffers whose bytes are undefined (discarded, or a `free` that failed): freed at the end.
    set_aside: Vec<BufferId>,
    /// Chunks those may still hold in the tiers.
    set_aside_chunks: usize,
}

impl Model {
    fn pick(&self, buf: usize) -> Option<usize> {
        (!self.buffers.is_empty()).then(|| buf % self.buffers.len())
    }

    /// A byte range of buffer `i` from arbitrary numbers.
    fn span(&self, i: usize, at: usize, len: usize) -> (usize, usize) {
        let size = self.buffers[i].1.len();
        let offset = at % size;
        (offset, len.min(size - offset))
    }

    /// Buffer `i`'s bytes are no longer known: it is no longer checked, only freed at the end.
    fn set_aside(&mut self, i: usize) {
        let (id, bytes, _) = self.buffers.remove(i);
        self.set_aside.push(id);
        self.set_aside_chunks += bytes.len().div_ceil(self.chunk);
    }

    fn held(&self, id: BufferId) -> bool {
        self.holds.iter().any(|(r, _)| r.buffer == id)
    }

    /// Whether running out of memory is legitimate now: something is held, or the data no
    /// longer fits in the tiers below HBM alone (then HBM and host together may be full; a
    /// budget may leave HBM only one chunk). Buffers set aside still take room.
    fn may_run_out(&self) -> bool {
        let chunks: usize = self.buffers.iter().map(|(_, bytes, _)| bytes.len().div_ceil(self.chunk)).sum();
        !self.holds.is_empty() || chunks + self.set_aside_chunks > self.spill_chunks
    }

    /// Errors the engine may legitimately return for a valid request under tiny caps.
    fn is_pressure(&self, e: &Error) -> bool {
        match e {
            Error::WouldNeverFit { .. } => true,
            // Writing what another hold reads in a neighbour's HBM.
            Error::AcquiredInPlace { buffer, .. } => {
                self.holds.iter().any(|(r, access)| r.buffer == *buffer && *access != Access::ReadWrite)
            }
            Error::OutOfMemory { .. } => self.may_run_out(),
            _ => self.injected(e),
        }
    }

    /// Whether `e` is a driver or file error injected on purpose.
    fn injected(&self, e: &Error) -> bool {
        self.injecting && matches!(e, Error::Device { .. } | Error::File { .. })
    }
}

const HBM_CHUNKS: usize = 8;
/// What each of the two neighbours lends in the four-tier test.
const PEER_CHUNKS: usize = 4;
const HOST_CHUNKS: usize = 24;
const FILE_CHUNKS: usize = 64;
/// The host tier of the three-tier test: far less than the data, so chunks spill to the file.
const SMALL_HOST_CHUNKS: usize = 6;

type Sim = Option<std::sync::Arc<tiermem::mechanism::sim::SimDevice>>;

fn run(
    engine: &Engine,
    sim: &Sim,
    ops: &[Op],
    host_chunks: usize,
    file_chunks: Option<usize>,
) -> Result<(), TestCaseError> {
    let device = engine.device().clone();
    let stream = StreamHandle(0);
    let spill_chunks = host_chunks + file_chunks.unwrap_or(0);
    let mut m = Model {
        chunk: engine.chunk_size(),
        spill_chunks,
        has_file: file_chunks.is_some(),
        has_peers: !engine.peer_lenders().is_empty(),
        buffers: Vec::new(),
        holds: Vec::new(),
        tickets: Vec::new(),
        injecting: sim.as_ref().is_some_and(|sim| sim.injecting_errors()),
        set_aside: Vec::new(),
        set_aside_chunks: 0,
    };
    let mut scheduled = 0; // steps of the schedule set, 0 for none
    for op in ops {
        match *op {
            Op::Alloc { quarters, extra, read_only, priority } => {
                if m.buffers.len() >= 8 {
                    continue;
                }
                let size = quarters * CHUNK / 4 + extra;
                let options = AllocOptions { priority, read_only, ..AllocOptions::default() };
                match engine.alloc(size, options) {
                    Ok((id, _)) => m.buffers.push((id, vec![0; size], read_only)),
                    Err(e) => prop_assert!(m.injected(&e), "alloc: {e}"),
                }
            }
            Op::Write { buf, at, len, seed } => {
                let Some(i) = m.pick(buf) else { continue };
                let (offset, len) = m.span(i, at, len);
                let data = pattern(seed, len);
                match engine.write(m.buffers[i].0, offset, &data) {
                    Ok(()) => m.buffers[i].1[offset..offset + len].copy_from_slice(&data),
                    // More than the HBM cap goes in windows: those before the failing one are written.
                    Err(Error::PartlyWritten { written, source, .. }) => {
                        prop_assert!(written > 0 && written < len && m.is_pressure(&source), "write: {source}");
                        m.buffers[i].1[offset..offset + written].copy_from_slice(&data[..written]);
                    }
                    Err(e) => prop_assert!(m.is_pressure(&e), "write: {e}"),
                }
            }
            Op::KernelWrite { buf, at, len, seed } => {
                let Some(i) = m.pick(buf) else { continue };
                let (offset, len) = m.span(i, at, len);
                let (id, _, read_only) = m.buffers[i];
                let region = [Region::bytes(id, offset, len)];
                match engine.acquire(&region, Access::ReadWrite, stream) {
                    Ok(()) => {
                        prop_assert!(!read_only, "a read-only buffer was acquired ReadWrite");
                        let data = pattern(seed, len);
                        let va = engine.device_ptr(id).unwrap() + offset as u64;
                        device.write(va, &data).map_err(|e| TestCaseError::fail(e.to_string()))?;
                        engine.release(&region, stream).map_err(|e| TestCaseError::fail(e.to_string()))?;
                        m.buffers[i].1[offset..offset + len].copy_from_slice(&data);
                    }
                    Err(Error::ReadOnly { .. }) => prop_assert!(read_only),
                    Err(e) => prop_assert!(m.is_pressure(&e), "acquire: {e}"),
                }
            }
            Op::KernelRead { buf, at, len } => {
                let Some(i) = m.pick(buf) else { continue };
                let (offset, len) = m.span(i, at, len);
                let id = m.buffers[i].0;
                let region = [Region::bytes(id, offset, len)];
                // Half the reads allow chunks in the peer tier to be read where they lie.
                let access = if (at ^ len) % 2 == 0 { Access::InPlaceOk } else { Access::ReadOnly };
                match engine.acquire(&region, access, stream) {
                    Ok(()) => {
                        let mut out = vec![0u8; len];
                        let va = engine.device_ptr(id).unwrap() + offset as u64;
                        device.read(va, &mut out).map_err(|e| TestCaseError::fail(e.to_string()))?;
                        engine.release(&region, stream).map_err(|e| TestCaseError::fail(e.to_string()))?;
                        let want = &m.buffers[i].1[offset..offset + len];
                        prop_assert!(
                            out == want,
                            "device bytes of {id} at {offset}+{len} differ from the model: {}",
                            describe_difference(&out, want, offset, m.chunk)
                        );
                    }
                    Err(e) => prop_assert!(m.is_pressure(&e), "acquire: {e}"),
                }
            }
            Op::Check { buf } => {
                let Some(i) = m.pick(buf) else { continue };
                check(engine, &m, i)?;
            }
            Op::Hold { buf, at, len, write } => {
                let Some(i) = m.pick(buf) else { continue };
                let (offset, len) = m.span(i, at, len);
                let (id, _, read_only) = m.buffers[i];
                let access = match (write && !read_only, at % 2 == 0) {
                    (true, _) => Access::ReadWrite,
                    (false, true) => Access::InPlaceOk,
                    (false, false) => Access::ReadOnly,
                };
                let region = Region::bytes(id, offset, len);
                match engine.acquire(&[region], access, stream) {
                    Ok(()) => m.holds.push((region, access)),
                    Err(e) => prop_assert!(m.is_pressure(&e), "hold: {e}"),
                }
            }
            Op::Unhold { index } => {
                if m.holds.is_empty() {
                    continue;
                }
                let (region, _) = m.holds.swap_remove(index % m.holds.len());
                engine.release(&[region], stream).map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
            Op::Schedule { rotate, pairs, clear } => {
                if clear || m.buffers.is_empty() {
                    engine.clear_schedule();
                    scheduled = 0;
                    continue;
                }
                let mut ids: Vec<_> = m.buffers.iter().map(|b| b.0).collect();
                let n = ids.len();
                ids.rotate_left(rotate % n);
                let steps: Vec<Vec<_>> = ids.chunks(if pairs { 2 } else { 1 }).map(<[_]>::to_vec).collect();
                scheduled = steps.len();
                engine.set_schedule(steps).map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
            Op::Advance { step, chunks } => {
                if scheduled == 0 {
                    prop_assert!(engine.advance(0, CHUNK).is_err(), "advance with no schedule");
                    continue;
                }
                // Freed buffers leave their steps empty; the step count stays.
                if let Err(e) = engine.advance(step % scheduled, chunks * m.chunk) {
                    prop_assert!(m.is_pressure(&e), "advance: {e}");
                }
            }
            Op::SetPeerLending { gpu, chunks } => match engine.set_peer_lending(gpu, chunks * m.chunk) {
                Ok(_) => prop_assert!(m.has_peers, "GPU {gpu} lent without a peer tier"),
                Err(Error::Config(e)) => prop_assert!(!m.has_peers && e.contains("does not lend"), "{e}"),
                Err(e) => prop_assert!(m.is_pressure(&e), "set_peer_lending: {e}"),
            },
            Op::SetBudget { chunks } => match engine.set_hbm_budget(chunks * m.chunk) {
                Ok(ticket) => m.tickets.push(ticket),
                Err(e) => prop_assert!(m.injected(&e), "set_hbm_budget: {e}"),
            },
            Op::Prefetch { buf } => {
                let Some(i) = m.pick(buf) else { continue };
                if let Err(e) = engine.prefetch(&[Region::whole(m.buffers[i].0)]) {
                    prop_assert!(m.injected(&e), "prefetch: {e}");
                }
            }
            Op::PageOut { buf } => {
                let target = match buf.and_then(|b| m.pick(b)) {
                    Some(i) => Target::Buffer(m.buffers[i].0),
                    None => Target::All,
                };
                let any_held = match target {
                    Target::Buffer(id) => m.held(id),
                    Target::All => !m.holds.is_empty(),
                };
                match engine.page_out(target) {
                    Ok(()) => prop_assert!(!any_held, "page_out of an acquired buffer succeeded"),
                    Err(Error::Acquired { .. }) => prop_assert!(any_held),
                    Err(e) => prop_assert!(m.is_pressure(&e), "page_out: {e}"),
                }
            }
            Op::PageOutStart { buf } => {
                let Some(i) = m.pick(buf) else { continue };
                let id = m.buffers[i].0;
                match engine.page_out_start(Target::Buffer(id)) {
                    Ok(ticket) => m.tickets.push(ticket),
                    Err(Error::Acquired { .. }) => prop_assert!(m.held(id)),
                    Err(e) => prop_assert!(m.is_pressure(&e), "page_out_start: {e}"),
                }
            }
            Op::Finish => {
                if let Some(ticket) = m.tickets.pop() {
                    if let Err(e) = engine.finish(ticket) {
                        prop_assert!(m.injected(&e), "finish: {e}");
                    }
                }
            }
            Op::PageIn { buf } => {
                let Some(i) = m.pick(buf) else { continue };
                if let Err(e) = engine.page_in(Target::Buffer(m.buffers[i].0)) {
                    prop_assert!(m.is_pressure(&e), "page_in: {e}");
                }
            }
            Op::Exchange { out, inn } => {
                let (Some(o), Some(i)) = (m.pick(out), m.pick(inn)) else { continue };
                let (out_id, in_id) = (m.buffers[o].0, m.buffers[i].0);
                match engine.exchange(Target::Buffer(out_id), Target::Buffer(in_id)) {
                    Ok(()) => {
                        prop_assert!(o != i && !m.held(out_id), "exchange accepted a conflict or an acquired buffer")
                    }
                    Err(Error::Conflict { .. }) => prop_assert!(o == i),
                    Err(Error::Acquired { .. }) => prop_assert!(m.held(out_id)),
                    Err(e) => prop_assert!(m.is_pressure(&e), "exchange: {e}"),
                }
            }
            Op::PageOutToFile { buf } => {
                let Some(i) = m.pick(buf) else { continue };
                let id = m.buffers[i].0;
                match engine.page_out_to_file(Target::Buffer(id)) {
                    Ok(()) => prop_assert!(m.has_file && !m.held(id)),
                    Err(Error::Config(_)) => prop_assert!(!m.has_file),
                    Err(Error::Acquired { .. }) => prop_assert!(m.held(id)),
                    Err(e) => prop_assert!(m.is_pressure(&e), "page_out_to_file: {e}"),
                }
            }
            Op::Free { buf } => {
                let Some(i) = m.pick(buf) else { continue };
                let id = m.buffers[i].0;
                match engine.free(id) {
                    Ok(()) => {
                        prop_assert!(!m.held(id));
                        m.buffers.remove(i);
                        let again = engine.free(id);
                        prop_assert!(matches!(again, Err(Error::UnknownBuffer { .. })), "double free: {again:?}");
                    }
                    Err(Error::Acquired { .. }) => prop_assert!(m.held(id)),
                    Err(e) => {
                        // A free that fails has discarded what it unmapped already (free's
                        // contract: retry it); the retry comes at the end, without injection.
                        prop_assert!(m.injected(&e), "free: {e}");
                        m.set_aside(i);
                    }
                }
            }
            Op::Discard { buf } => {
                let Some(i) = m.pick(buf) else { continue };
                let id = m.buffers[i].0;
                match engine.discard(&[Region::whole(id)]) {
                    Ok(_) => m.set_aside(i), // its bytes are undefined from now on
                    Err(Error::Acquired { .. }) => prop_assert!(m.held(id)),
                    Err(e) => prop_assert!(m.injected(&e), "discard: {e}"),
                }
            }
        }
    }
    if let Some(sim) = sim {
        sim.inject_errors(None, 0);
    }
    engine.inject_file_errors(None, 0);
    for ticket in std::mem::take(&mut m.tickets) {
        // A ticket of a transfer whose driver call failed may report that failure.
        if let Err(e) = engine.finish(ticket) {
            prop_assert!(m.injected(&e), "finish: {e}");
        }
    }
    for (region, _) in m.holds.drain(..) {
        engine.release(&[region], stream).map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
    for i in 0..m.buffers.len() {
        check(engine, &m, i)?;
    }
    for id in m.buffers.iter().map(|b| b.0).chain(m.set_aside.iter().copied()) {
        engine.free(id).map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
    Ok(())
}

/// Reads buffer `i` whole, chunk by chunk (a whole buffer may exceed the HBM cap).
fn check(engine: &Engine, m: &Model, i: usize) -> Result<(), TestCaseError> {
    let (id, expected, _) = &m.buffers[i];
    for offset in (0..expected.len()).step_by(CHUNK) {
        let len = CHUNK.min(expected.len() - offset);
        let mut out = vec![0u8; len];
        match engine.read(*id, offset, &mut out) {
            Ok(()) => prop_assert!(
                out == expected[offset..offset + len],
                "buffer {id} bytes {offset}+{len} differ from the model: {}",
                describe_difference(&out, &expected[offset..offset + len], offset, m.chunk)
            ),
            Err(e) => prop_assert!(m.is_pressure(&e), "read: {e}"),
        }
    }
    Ok(())
}

/// Where and how two byte strings differ, for a failure message (`got` read from byte `at` of
/// a buffer in chunks of `chunk` bytes).
fn describe_difference(got: &[u8], want: &[u8], at: usize, chunk: usize) -> String {
    let differing: Vec<usize> = (0..got.len()).filter(|&i| got[i] != want[i]).collect();
    let (first, last) = (differing[0], differing[differing.len() - 1]);
    let zeros = differing.iter().all(|&i| got[i] == 0);
    format!(
        "{} bytes differ, first at {first} (chunk-relative {}), last at {last}; got {:02x?}.. want {:02x?}..{}",
        differing.len(),
        (at + first) % chunk,
        &got[first..(first + 8).min(got.len())],
        &want[first..(first + 8).min(want.len())],
        if zeros { " (all zeros)" } else { "" }
    )
}

/// Sets the simulated device's timing for one case: `Timing::ALL[timing]`, unless
/// `TIERMEM_TEST_TIMING` (eager, lazy or random) names one for every case. In a quarter of the
/// cases (`faults == 0`), about one in 40 driver calls and one in 20 file reads and writes fail
/// at random, `seed` picking which.
fn set_conditions(engine: &Engine, sim: &Sim, timing: usize, faults: u64, seed: u64) {
    use tiermem::mechanism::sim::Timing;
    let forced = std::env::var("TIERMEM_TEST_TIMING").ok().map(|name| match name.as_str() {
        "eager" => Timing::Eager,
        "lazy" => Timing::Lazy,
        "random" => Timing::Random,
        other => panic!("TIERMEM_TEST_TIMING={other:?}: use eager, lazy or random"),
    });
    if let Some(sim) = sim {
        sim.set_timing(forced.unwrap_or(Timing::ALL[timing % Timing::ALL.len()]));
        if faults == 0 {
            sim.inject_errors(Some(40), seed ^ 0xfa17);
            engine.inject_file_errors(Some(20), seed ^ 0x10e4);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn every_byte_survives_any_sequence_of_moves(ops in prop::collection::vec(op(), 100), policy in 0usize..4, timing in 0usize..3, faults in 0u64..4, fault_seed in any::<u64>()) {
        let policy = tiermem::policy::PolicyKind::ALL[policy];
        let (engine, sim) = support::engine(HBM_CHUNKS, HOST_CHUNKS, EngineConfig { policy, batch_chunks: 3, ..support::config() });
        set_conditions(&engine, &sim, timing, faults, fault_seed);
        run(&engine, &sim, &ops, HOST_CHUNKS, None)?;
        support::assert_no_leaks(engine, sim);
    }

    /// The same with a file tier under a host tier that cannot hold the data: chunks cross
    /// all three tiers.
    #[test]
    fn every_byte_survives_moves_across_three_tiers(ops in prop::collection::vec(op(), 100), policy in 0usize..4, timing in 0usize..3, faults in 0u64..4, fault_seed in any::<u64>()) {
        let policy = tiermem::policy::PolicyKind::ALL[policy];
        let path = support::file_tier_path("property");
        // Half the cases learn a loop from the acquires (control.rs), paging one chunk ahead.
        let learn_loops = (fault_seed & 1 == 0).then_some(CHUNK);
        let config = EngineConfig { policy, batch_chunks: 3, file: Some(path.clone()), file_limit: FILE_CHUNKS * CHUNK, learn_loops, ..support::config() };
        let (engine, sim) = support::engine(HBM_CHUNKS, SMALL_HOST_CHUNKS, config);
        set_conditions(&engine, &sim, timing, faults, fault_seed);
        run(&engine, &sim, &ops, SMALL_HOST_CHUNKS, Some(FILE_CHUNKS))?;
        support::assert_no_leaks(engine, sim);
        prop_assert!(!path.exists(), "the file tier's file outlived the engine");
    }

    /// The same on GPU 0 of a simulated node of three, its two neighbours lending HBM (the
    /// peer tier) that they take back at random: chunks cross all four tiers.
    #[test]
    fn every_byte_survives_moves_across_four_tiers(ops in prop::collection::vec(op(), 100), policy in 0usize..4, timing in 0usize..3, faults in 0u64..4, fault_seed in any::<u64>()) {
        four_tiers(&ops, 1, policy, timing, faults, fault_seed)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 150, ..ProptestConfig::default() })]

    /// The four-tier test with chunks of three granules (`EngineConfig::chunk`, the
    /// `ChunkedDevice` adaptor): each chunk one allocation and one mapping of 6 MiB, in HBM,
    /// host, file and peer slabs alike; every cap in such chunks.
    #[test]
    fn every_byte_survives_moves_in_chunks_of_three_granules(ops in prop::collection::vec(op(), 100), policy in 0usize..4, timing in 0usize..3, faults in 0u64..4, fault_seed in any::<u64>()) {
        four_tiers(&ops, 3, policy, timing, faults, fault_seed)?;
    }
}

/// `ops` on GPU 0 of a simulated node of three whose neighbours lend, with a file tier under a
/// small host tier, in chunks of `k` granules.
fn four_tiers(
    ops: &[Op],
    k: usize,
    policy: usize,
    timing: usize,
    faults: u64,
    fault_seed: u64,
) -> Result<(), TestCaseError> {
    let policy = tiermem::policy::PolicyKind::ALL[policy];
    let chunk = k * CHUNK;
    let path = support::file_tier_path("property-peers");
    // Half the cases with peer slabs readable in place (TIERMEM_PEER_IN_PLACE).
    let peer_in_place = fault_seed.is_multiple_of(2);
    // And in half of them, pre-eviction (pre_evict.rs) of two chunks.
    let pre_evict = ((fault_seed >> 1) & 1) as usize * 2 * chunk;
    // And loops learned from the acquires in half of all.
    let learn_loops = ((fault_seed >> 2) & 1 == 0).then_some(chunk);
    let config = EngineConfig {
        policy,
        batch_chunks: 3,
        chunk: Some(chunk),
        file: Some(path.clone()),
        file_limit: FILE_CHUNKS * chunk,
        peer_in_place,
        pre_evict,
        learn_loops,
        ..support::config()
    };
    let (engine, sim) = support::engine_with_peers(k * HBM_CHUNKS, k * SMALL_HOST_CHUNKS, k * PEER_CHUNKS, config);
    prop_assert_eq!(engine.chunk_size(), chunk);
    prop_assert_eq!(engine.peer_lenders().len(), 2, "{:?}", engine.peer_notes());
    let sim = Some(sim);
    set_conditions(&engine, &sim, timing, faults, fault_seed);
    run(&engine, &sim, ops, SMALL_HOST_CHUNKS, Some(FILE_CHUNKS))?;
    support::assert_no_leaks(engine, sim);
    prop_assert!(!path.exists(), "the file tier's file outlived the engine");
    Ok(())
}
