//! Several threads drive one `Engine` at once, each with its own stream, its own buffers and
//! its own reference model (a `Vec<u8>` per buffer), plus a few buffers shared by all, each
//! model behind a `Mutex`. Every thread runs random operations (alloc, free, host writes and
//! reads, "kernels" on its stream, prefetch, page-out, page-in, exchange, spill to the file)
//! from its own seeded RNG; every byte read back must equal the model.
//!
//! The engine orders its copies against the streams it is given; ordering work between
//! streams is the program's job, as in CUDA, so the test does it:
//! - A "kernel" is an asynchronous copy on the thread's stream between a pinned staging area
//!   and the acquired bytes, between `acquire` and `release` on that stream. So the copy runs
//!   after the page-ins the stream was told to wait for, and under `Timing::Lazy` it is still
//!   queued when the chunk is released: the engine must wait for it before the chunk moves.
//! - Host copies (`Engine::write` / `Engine::read`) run on the legacy stream, so a thread
//!   drains its own stream before one, and before it reuses its staging area.
//! - Bytes of a shared buffer are touched only under its lock, and the thread drains its
//!   stream before dropping the lock, so the next holder sees every byte. Moves (page-out,
//!   prefetch, exchange, ...) change no byte and run on any live buffer without the lock.
//!
//! Errors must be legitimate: `OutOfMemory` only while another thread held some chunks
//! (allocations are kept within the tiers below HBM, so the data alone always fits), and
//! `Acquired` only for a buffer another thread held meanwhile. A ledger records which buffers
//! each thread may hold (from before its acquire until after its release) and, for each engine
//! call, which of them were held at some moment of it. No request can exceed the HBM cap, so
//! `WouldNeverFit` is never legitimate here; `prefetch`, `finish` and freeing a thread's own
//! buffer must always succeed.
//!
//! Meanwhile one more thread moves the HBM budget at random between `BUDGET_FLOOR_CHUNKS` (the
//! most chunks one call needs: its spans and buffers cover at most three) and the whole cap, as
//! a node daemon would, and `finish`es some of its changes. No error is excused for it: a
//! request the budget of the moment cannot hold alone must still be served by evicting.
//!
//! It runs every `Timing` of the simulated device, with and without a file tier, over a few
//! seeds. A seed fixes each thread's random draws, not how the threads interleave: a failure
//! may need a few runs to recur. `TIERMEM_THREADS_OPS` sets the operations per thread and
//! configuration.

mod support;

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};
use support::{pattern, CHUNK};
use tiermem::mechanism::sim::Timing;
use tiermem::mechanism::{HostPtr, StreamPriority};
use tiermem::policy::PolicyKind;
use tiermem::{Access, AllocOptions, BufferId, Engine, EngineConfig, Error, Region, StreamHandle, Target, Ticket};

const THREADS: usize = 4;
const HBM_CHUNKS: usize = 8;
/// The host tier without a file tier: twice HBM, so chunks are evicted all the time.
const HOST_CHUNKS: usize = 16;
/// The host tier above a file tier: smaller than the data, so chunks spill to the file.
const SMALL_HOST_CHUNKS: usize = 6;
const FILE_CHUNKS: usize = 64;
const OWN_BUFFERS_PER_THREAD: usize = 2;
const SHARED_SIZES: [usize; 2] = [2 * CHUNK + 4096, 3 * CHUNK / 4 + 77];
/// The longest write or read: up to 1.5 chunks, so it may span three.
const MAX_SPAN: usize = 3 * CHUNK / 2;
const SEEDS: [u64; 2] = [1, 2];
const DEFAULT_OPS_PER_THREAD: usize = 480;
/// The smallest budget the budget thread sets: one call's chunks at most.
const BUDGET_FLOOR_CHUNKS: usize = 3;

/// What a thread does in one step; `OPS` says how often.
#[rustfmt::skip]
#[derive(Clone, Copy)]
enum Op {
    Alloc, Free, Write, Read, KernelWrite, KernelRead, Check, Prefetch, PageOut, PageOutAll, PageOutStart, Finish,
    PageIn, Exchange, PageOutToFile,
}

/// The operations a thread picks from, each as often as it appears here.
#[rustfmt::skip]
const OPS: [Op; 29] = {
    use Op::*;
    [
        Alloc, Alloc, Free, Write, Write, Write, Write, Read, Read, Read, KernelWrite, KernelWrite, KernelWrite,
        KernelWrite, KernelRead, KernelRead, KernelRead, Check, Prefetch, Prefetch, PageOut, PageOut, PageOutAll,
        PageOutStart, Finish, PageIn, PageIn, Exchange, PageOutToFile,
    ]
};

/// Who may hold what, to judge errors.
struct Ledger {
    /// Chunks of the live buffers, kept within the tiers below HBM.
    allocated_chunks: usize,
    /// The buffer each thread's current operation may hold pinned: (thread, buffer).
    holds: Vec<(usize, BufferId)>,
    /// For each thread inside an engine call: the buffers others held at some moment of it.
    seen: Vec<Option<Vec<BufferId>>>,
}

/// What all threads share: the engine, the ledger, the shared buffers and their models.
struct World<'e> {
    engine: &'e Engine,
    label: String,
    has_file: bool,
    spill_chunks: usize,
    ledger: Mutex<Ledger>,
    shared: Vec<(BufferId, Mutex<Vec<u8>>)>,
    excused_errors: AtomicUsize,
}

impl World<'_> {
    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().expect("ledger lock")
    }

    /// Counts `chunks` more as allocated, unless the data would no longer fit below HBM.
    fn reserve(&self, chunks: usize) -> bool {
        let mut ledger = self.ledger();
        let fits = ledger.allocated_chunks + chunks <= self.spill_chunks;
        ledger.allocated_chunks += if fits { chunks } else { 0 };
        fits
    }

    /// Runs `f` with `buffer` marked as possibly held by `thread` (one buffer at a time).
    fn holding<R>(&self, thread: usize, buffer: BufferId, f: impl FnOnce() -> R) -> R {
        let mut ledger = self.ledger();
        ledger.holds.push((thread, buffer));
        for (_, seen) in ledger.seen.iter_mut().enumerate().filter(|(other, _)| *other != thread) {
            seen.iter_mut().for_each(|held| held.push(buffer));
        }
        drop(ledger);
        let result = f();
        self.ledger().holds.retain(|&(holder, _)| holder != thread);
        result
    }

    /// Runs one engine call of `thread`: its value, `None` for a legitimate error (see the
    /// module's doc), a panic for any other.
    fn judged<T>(&self, thread: usize, what: &str, call: impl FnOnce() -> tiermem::Result<T>) -> Option<T> {
        {
            let mut ledger = self.ledger();
            let held = ledger.holds.iter().filter(|h| h.0 != thread).map(|h| h.1).collect();
            ledger.seen[thread] = Some(held);
        }
        let result = call();
        let held = self.ledger().seen[thread].take().expect("set above");
        let excused = |e: &Error| match e {
            Error::OutOfMemory { .. } => !held.is_empty(),
            Error::Acquired { buffer, .. } => held.contains(buffer),
            _ => false,
        };
        match result {
            Ok(value) => Some(value),
            Err(e) if excused(&e) => {
                self.excused_errors.fetch_add(1, Relaxed);
                None
            }
            Err(e) => panic!("[{}] thread {thread}: {what}: {e} (others held {held:?} meanwhile)", self.label),
        }
    }

    /// Reads buffer `id` whole, a chunk at a time, and compares it with `model`.
    fn check(&self, thread: usize, id: BufferId, model: &[u8]) {
        for offset in (0..model.len()).step_by(CHUNK) {
            let mut out = vec![0u8; CHUNK.min(model.len() - offset)];
            let read =
                self.holding(thread, id, || self.judged(thread, "check", || self.engine.read(id, offset, &mut out)));
            if read.is_some() {
                self.assert_same(thread, "check", id, offset, &out, &model[offset..offset + out.len()]);
            }
        }
    }

    fn assert_same(&self, thread: usize, what: &str, id: BufferId, offset: usize, got: &[u8], want: &[u8]) {
        let Some(first) = (0..got.len()).find(|&i| got[i] != want[i]) else { return };
        let differing = (first..got.len()).filter(|&i| got[i] != want[i]).count();
        let at = offset + first;
        panic!(
            "[{}] thread {thread}: {what}: buffer {id} at {offset}+{}: {differing} bytes differ from the model, first \
             at {at} (chunk-relative {}); got {:02x?}.. want {:02x?}..",
            self.label,
            got.len(),
            at % CHUNK,
            &got[first..(first + 8).min(got.len())],
            &want[first..(first + 8).min(want.len())],
        );
    }
}

/// A buffer a thread may use: its own `own[index]`, or the shared `shared[index]`.
#[derive(Clone, Copy)]
struct Pick {
    own: bool,
    index: usize,
    id: BufferId,
    size: usize,
}

/// One thread: its stream, its staging area, its buffers and their models.
struct Worker<'w, 'e> {
    world: &'w World<'e>,
    thread: usize,
    rng: Pcg64,
    stream: StreamHandle,
    /// Pinned host memory of `MAX_SPAN` bytes that the thread's kernels copy from and to.
    staging: HostPtr,
    own: Vec<(BufferId, Vec<u8>)>,
    tickets: Vec<Ticket>,
}

impl Worker<'_, '_> {
    fn drain_stream(&self) {
        let drained = self.world.engine.device().synchronize_stream(self.stream);
        drained.unwrap_or_else(|e| panic!("[{}] thread {}: synchronize_stream: {e}", self.world.label, self.thread));
    }

    fn pick(&mut self) -> Pick {
        let index = self.rng.random_range(0..self.own.len() + self.world.shared.len());
        match self.own.get(index) {
            Some((id, model)) => Pick { own: true, index, id: *id, size: model.len() },
            None => {
                let index = index - self.own.len();
                Pick { own: false, index, id: self.world.shared[index].0, size: SHARED_SIZES[index] }
            }
        }
    }

    /// Runs `op` on the model bytes of `pick`: a shared buffer's lock is held throughout,
    /// and the stream drained before it is dropped, so the next holder sees every byte.
    fn with_model(&mut self, pick: Pick, op: impl FnOnce(&Self, &mut [u8])) {
        if pick.own {
            let mut model = std::mem::take(&mut self.own[pick.index].1);
            op(self, &mut model);
            self.own[pick.index].1 = model;
        } else {
            let mut model = self.world.shared[pick.index].1.lock().expect("shared model lock");
            op(self, &mut model);
            self.drain_stream();
        }
    }

    /// A random byte range of a buffer of `size` bytes.
    fn span(&mut self, size: usize) -> (usize, usize) {
        let offset = self.rng.random_range(0..size);
        (offset, self.rng.random_range(1..=MAX_SPAN).min(size - offset))
    }

    fn judged<T>(&self, what: &str, call: impl FnOnce() -> tiermem::Result<T>) -> Option<T> {
        self.world.judged(self.thread, what, call)
    }

    /// An engine call that must succeed whatever the other threads do.
    fn must<T>(&self, what: &str, result: tiermem::Result<T>) -> T {
        result.unwrap_or_else(|e| panic!("[{}] thread {}: {what}: {e}", self.world.label, self.thread))
    }

    /// Runs one random operation; false if it had nothing to act on.
    fn step(&mut self) -> bool {
        let op = OPS[self.rng.random_range(0..OPS.len())];
        let engine = self.world.engine;
        let pick = self.pick();
        let id = pick.id;
        match op {
            Op::Alloc => {
                let size = self.rng.random_range(1..=8) * CHUNK / 4 + self.rng.random_range(0..4096);
                if self.own.len() >= OWN_BUFFERS_PER_THREAD || !self.world.reserve(size.div_ceil(CHUNK)) {
                    return false;
                }
                let options = AllocOptions { priority: self.rng.random_range(-2..3), ..AllocOptions::default() };
                let (id, _) = self.must("alloc", engine.alloc(size, options));
                self.own.push((id, vec![0; size]));
            }
            Op::Free => {
                if !pick.own {
                    return false;
                }
                self.own.remove(pick.index);
                self.must("free", engine.free(id));
                self.world.ledger().allocated_chunks -= pick.size.div_ceil(CHUNK);
            }
            Op::Write | Op::KernelWrite => {
                let ((offset, len), seed) = (self.span(pick.size), self.rng.random());
                let data = pattern(seed, len);
                let kernel = matches!(op, Op::KernelWrite);
                self.with_model(pick, |w, model| {
                    if if kernel { w.kernel_write(id, offset, &data) } else { w.host_write(id, offset, &data) } {
                        model[offset..offset + len].copy_from_slice(&data);
                    }
                });
            }
            Op::Read | Op::KernelRead => {
                let (offset, len) = self.span(pick.size);
                let kernel = matches!(op, Op::KernelRead);
                self.with_model(pick, |w, model| {
                    let got = if kernel { w.kernel_read(id, offset, len) } else { w.host_read(id, offset, len) };
                    if let Some(got) = got {
                        let what = if kernel { "kernel read" } else { "read" };
                        w.world.assert_same(w.thread, what, id, offset, &got, &model[offset..offset + len]);
                    }
                });
            }
            Op::Check => self.with_model(pick, |w, model| {
                w.drain_stream();
                w.world.check(w.thread, id, model);
            }),
            Op::Prefetch => self.must("prefetch", engine.prefetch(&[Region::whole(id)])),
            Op::PageOut => _ = self.judged("page_out", || engine.page_out(Target::Buffer(id))),
            Op::PageOutAll => _ = self.judged("page_out(All)", || engine.page_out(Target::All)),
            Op::PageOutStart => {
                let ticket = self.judged("page_out_start", || engine.page_out_start(Target::Buffer(id)));
                self.tickets.extend(ticket);
            }
            Op::Finish => {
                let Some(ticket) = self.tickets.pop() else { return false };
                self.must("finish", engine.finish(ticket));
            }
            Op::PageIn => _ = self.judged("page_in", || engine.page_in(Target::Buffer(id))),
            Op::Exchange => {
                let incoming = self.pick().id;
                if incoming == id {
                    return false;
                }
                _ = self.judged("exchange", || engine.exchange(Target::Buffer(id), Target::Buffer(incoming)));
            }
            Op::PageOutToFile => {
                if !self.world.has_file {
                    return false;
                }
                _ = self.judged("page_out_to_file", || engine.page_out_to_file(Target::Buffer(id)));
            }
        }
        true
    }

    fn host_write(&self, id: BufferId, offset: usize, data: &[u8]) -> bool {
        self.drain_stream(); // the legacy stream's copy comes after this thread's kernels
        let engine = self.world.engine;
        self.world.holding(self.thread, id, || self.judged("write", || engine.write(id, offset, data))).is_some()
    }

    fn host_read(&self, id: BufferId, offset: usize, len: usize) -> Option<Vec<u8>> {
        self.drain_stream();
        let (engine, mut out) = (self.world.engine, vec![0u8; len]);
        self.world.holding(self.thread, id, || self.judged("read", || engine.read(id, offset, &mut out)))?;
        Some(out)
    }

    /// A kernel writing `data`: a copy from the staging area on the thread's stream, left
    /// queued (a shared buffer's stream is drained before its lock is dropped).
    fn kernel_write(&self, id: BufferId, offset: usize, data: &[u8]) -> bool {
        self.drain_stream(); // nothing reads the staging area any more
        let (engine, region) = (self.world.engine, [Region::bytes(id, offset, data.len())]);
        let acquired = self.world.holding(self.thread, id, || {
            self.judged("kernel write", || engine.acquire(&region, Access::ReadWrite, self.stream))?;
            let va = self.must("device_ptr", engine.device_ptr(id)) + offset as u64;
            // SAFETY: the staging area is this thread's pinned allocation of MAX_SPAN bytes, at
            // least `data.len()`, and no copy reads it now (the stream was drained). It stays
            // unmodified until the next kernel write drains the stream again.
            let queued = unsafe {
                std::ptr::copy_nonoverlapping(data.as_ptr(), self.staging as *mut u8, data.len());
                engine.device().copy_to_device_async(va, self.staging, data.len(), self.stream)
            };
            queued.expect("kernel write copy");
            self.must("release", engine.release(&region, self.stream));
            Some(())
        });
        acquired.is_some()
    }

    /// A kernel reading `len` bytes into the staging area on the thread's stream.
    fn kernel_read(&self, id: BufferId, offset: usize, len: usize) -> Option<Vec<u8>> {
        let (engine, region) = (self.world.engine, [Region::bytes(id, offset, len)]);
        self.world.holding(self.thread, id, || {
            self.judged("kernel read", || engine.acquire(&region, Access::ReadOnly, self.stream))?;
            let va = self.must("device_ptr", engine.device_ptr(id)) + offset as u64;
            // SAFETY: the staging area is this thread's pinned allocation of MAX_SPAN >= len
            // bytes; the host touches it only after draining the stream, below. An earlier
            // copy from it is ahead of this one on the same stream.
            let queued = unsafe { engine.device().copy_to_host_async(self.staging, va, len, self.stream) };
            queued.expect("kernel read copy");
            self.must("release", engine.release(&region, self.stream));
            Some(())
        })?;
        self.drain_stream();
        // SAFETY: the copy into the staging area has completed (the stream was drained) and
        // nothing else writes it.
        Some(unsafe { std::slice::from_raw_parts(self.staging as *const u8, len) }.to_vec())
    }
}

/// One thread's run: `ops` operations, then its tickets finished and its stream and staging
/// area given back. Returns its buffers and their models, and the operations it ran.
fn run_thread(world: &World, thread: usize, seed: u64, ops: usize) -> (Vec<(BufferId, Vec<u8>)>, usize) {
    let device = world.engine.device();
    let stream = device.create_stream(StreamPriority::High).expect("create_stream");
    let staging = device.alloc_pinned(MAX_SPAN).expect("staging area");
    let rng = Pcg64::seed_from_u64(seed << 8 | thread as u64);
    let mut worker = Worker { world, thread, rng, stream, staging, own: Vec::new(), tickets: Vec::new() };
    let ran = (0..ops).filter(|_| worker.step()).count();
    for ticket in std::mem::take(&mut worker.tickets) {
        worker.must("finish", world.engine.finish(ticket));
    }
    worker.drain_stream();
    device.destroy_stream(stream).expect("destroy_stream");
    device.free_pinned(staging, MAX_SPAN).expect("free staging area");
    (worker.own, ran)
}

/// Moves the HBM budget at random while `working`, then gives the whole cap back.
fn move_budget(world: &World, seed: u64, working: &AtomicBool) {
    let mut rng = Pcg64::seed_from_u64(seed << 8 | 0xb0);
    let set = |chunks: usize| {
        let ticket = world.engine.set_hbm_budget(chunks * CHUNK);
        ticket.unwrap_or_else(|e| panic!("[{}] set_hbm_budget({chunks} chunks): {e}", world.label))
    };
    while working.load(Relaxed) {
        let ticket = set(rng.random_range(BUDGET_FLOOR_CHUNKS..=HBM_CHUNKS));
        if rng.random_bool(0.5) {
            let finished = world.engine.finish(ticket);
            finished.unwrap_or_else(|e| panic!("[{}] finish of a budget change: {e}", world.label));
        }
        std::thread::sleep(std::time::Duration::from_micros(rng.random_range(0..300)));
    }
    let finished = world.engine.finish(set(HBM_CHUNKS));
    finished.unwrap_or_else(|e| panic!("[{}] finish of the last budget change: {e}", world.label));
}

/// One configuration: `THREADS` threads over one engine, then every buffer checked and freed,
/// and nothing leaked. Returns the operations run.
fn run_config(timing: Timing, with_file: bool, seed: u64, ops_per_thread: usize) -> usize {
    let label = format!("{timing:?}, file tier: {with_file}, seed {seed}");
    let path = with_file.then(|| support::file_tier_path("threads"));
    let host_chunks = if with_file { SMALL_HOST_CHUNKS } else { HOST_CHUNKS };
    let policy = PolicyKind::ALL[seed as usize % PolicyKind::ALL.len()];
    let config = EngineConfig {
        policy,
        batch_chunks: 3,
        file: path.clone(),
        file_limit: FILE_CHUNKS * CHUNK,
        // The configurations of even seeds learn loops from the acquires (control.rs).
        learn_loops: seed.is_multiple_of(2).then_some(CHUNK),
        ..support::config()
    };
    let (engine, sim) = support::sim_engine(HBM_CHUNKS + 4, HBM_CHUNKS, host_chunks, config);
    sim.set_timing(timing);
    sim.set_seed(seed);
    let shared = SHARED_SIZES.map(|size| (engine.alloc(size, AllocOptions::default()).expect("alloc").0, size));
    let world = World {
        engine: &engine,
        label,
        has_file: with_file,
        spill_chunks: host_chunks + if with_file { FILE_CHUNKS } else { 0 },
        ledger: Mutex::new(Ledger {
            allocated_chunks: SHARED_SIZES.iter().map(|size| size.div_ceil(CHUNK)).sum(),
            holds: Vec::new(),
            seen: vec![None; THREADS + 1], // the main thread checks last
        }),
        shared: shared.iter().map(|&(id, size)| (id, Mutex::new(vec![0; size]))).collect(),
        excused_errors: AtomicUsize::new(0),
    };
    let world_ref = &world;
    let working = AtomicBool::new(true);
    let results: Vec<_> = std::thread::scope(|scope| {
        let budget = scope.spawn(|| move_budget(world_ref, seed, &working));
        let threads: Vec<_> =
            (0..THREADS).map(|t| scope.spawn(move || run_thread(world_ref, t, seed, ops_per_thread))).collect();
        let results = threads.into_iter().map(|t| t.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)));
        let results = results.collect();
        working.store(false, Relaxed);
        budget.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        results
    });
    let ran = results.iter().map(|(_, ran)| ran).sum();
    let mut buffers: Vec<_> = results.into_iter().flat_map(|(own, _)| own).collect();
    buffers.extend(world.shared.iter().map(|(id, model)| (*id, model.lock().expect("shared model").clone())));
    for (id, model) in buffers {
        world.check(THREADS, id, &model);
        engine.free(id).unwrap_or_else(|e| panic!("[{}] free {id}: {e}", world.label));
    }
    eprintln!("[{}] {ran} operations, {} legitimate errors", world.label, world.excused_errors.load(Relaxed));
    drop(world);
    support::assert_no_leaks(engine, Some(sim));
    assert!(path.is_none_or(|path| !path.exists()), "the file tier's file outlived the engine");
    ran
}

/// Two tiers: HBM and the host tier.
#[test]
fn every_byte_survives_threads_over_hbm_and_host() {
    run_configs(false);
}

/// Three tiers: chunks spill to the file while other threads page out to it in the background
/// (it found three bugs, now regression tests in timing_races.rs and file_failpoints.rs).
#[test]
fn every_byte_survives_threads_over_three_tiers() {
    run_configs(true);
}

/// Every timing of the simulated device, over every seed.
fn run_configs(with_file: bool) {
    let ops_per_thread = std::env::var("TIERMEM_THREADS_OPS")
        .map_or(DEFAULT_OPS_PER_THREAD, |v| v.parse().expect("TIERMEM_THREADS_OPS: a number of operations"));
    let start = std::time::Instant::now();
    let mut total = 0;
    for timing in Timing::ALL {
        for seed in SEEDS {
            total += run_config(timing, with_file, seed, ops_per_thread);
        }
    }
    let configs = Timing::ALL.len() * SEEDS.len();
    eprintln!("{total} operations by {THREADS} threads over {configs} configurations in {:.1?}", start.elapsed());
}
