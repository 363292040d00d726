//! One soak thread: its own stream, buffers and random operations, and its turns on the
//! buffers all threads share.
//!
//! Streams are independent, as in CUDA, so ordering across them is the soak's job, exactly as
//! it is a program's: an operation on a shared buffer holds that buffer's lock from its
//! acquire until its stream has finished with the bytes; host copies (the legacy stream) wait
//! for the thread's stream first, and the thread's kernels wait for the legacy stream after.

use super::model::{first_difference, new_seed, runs, Contents, Kind, Tally, BLOCK, DISCARDED, ZEROS};
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use tiermem::mechanism::{DevicePtr, StreamHandle, StreamPriority};
use tiermem::{Access, AllocOptions, BufferId, Engine, Error, Region, Target, Ticket};

/// The shape of a soak, from its caps: buffer counts and sizes, the largest acquire.
pub struct Plan {
    /// The engine's HBM cap in chunks: budgets set while the soak runs are 60–100% of it.
    hbm_chunks: usize,
    blocks_per_chunk: usize,
    /// Chunks one operation acquires at most, so the threads' acquisitions fit in HBM together.
    region_chunks: usize,
    own_buffers: usize,
    max_buffer_blocks: usize,
    shared_buffers: usize,
    has_file: bool,
}

impl Plan {
    /// Data of about 3× the HBM cap with a file tier (1.5× without), a quarter of it shared.
    pub fn new(hbm_chunks: usize, chunk: usize, threads: usize, has_file: bool) -> Self {
        let total = if has_file { 3 * hbm_chunks } else { 3 * hbm_chunks / 2 };
        let own = (total - total / 4) / threads;
        let max_buffer_chunks = (own / 3).clamp(1, 6);
        Self {
            hbm_chunks,
            blocks_per_chunk: chunk / BLOCK,
            region_chunks: (hbm_chunks / (2 * threads)).max(1),
            own_buffers: (own / max_buffer_chunks).max(1),
            max_buffer_blocks: max_buffer_chunks * chunk / BLOCK,
            shared_buffers: (total / 4 / max_buffer_chunks).max(1),
            has_file,
        }
    }
}

/// A buffer and what it holds.
struct Buffer {
    id: BufferId,
    va: DevicePtr,
    blocks: Contents,
}

/// The buffers every thread uses, each behind a lock held for a whole operation.
pub struct SharedBuffers(Vec<Mutex<Buffer>>);

impl SharedBuffers {
    pub fn new(engine: &Engine, plan: &Plan, seed: u64) -> Result<Self, String> {
        let mut rng = rand_pcg::Pcg64::seed_from_u64(seed ^ 0x5aa5);
        let mut buffers = Vec::new();
        for _ in 0..plan.shared_buffers {
            let blocks = rng.random_range(1..=plan.max_buffer_blocks);
            buffers.push(Mutex::new(alloc(engine, blocks).map_err(|e| format!("soak: shared buffer: {e}"))?));
        }
        Ok(Self(buffers))
    }

    /// Checks every shared buffer whole and frees it.
    pub fn check_and_free(&self, engine: &Engine, tally: &Tally) {
        for buffer in &self.0 {
            let buffer = buffer.lock().unwrap_or_else(|p| p.into_inner());
            verify_by_host(engine, &buffer, 0, buffer.blocks.len(), tally);
            if let Err(e) = engine.free(buffer.id) {
                tally.unexpected(format!("free of shared buffer {}: {e}", buffer.id));
            }
        }
    }
}

fn alloc(engine: &Engine, blocks: usize) -> tiermem::Result<Buffer> {
    let (id, va) = engine.alloc(blocks * BLOCK, AllocOptions::default())?;
    Ok(Buffer { id, va, blocks: vec![ZEROS; blocks] })
}

/// Reads blocks `first..end` back through the engine and compares every byte.
fn verify_by_host(engine: &Engine, buffer: &Buffer, first: usize, end: usize, tally: &Tally) {
    let mut bytes = vec![0u8; (end - first) * BLOCK];
    for (k, part) in bytes.chunks_mut(16 * BLOCK).enumerate() {
        let offset = (first + k * 16) * BLOCK;
        match engine.read(buffer.id, offset, part) {
            Ok(()) => {}
            Err(e) if is_pressure(&e) => return tally.pressure(),
            Err(e) => return tally.unexpected(format!("read of {} at {offset}: {e}", buffer.id)),
        }
    }
    if let Some(at) = first_difference(&buffer.blocks, first, &bytes) {
        tally.mismatch(1, format!("buffer {} read back wrong at byte {at} (blocks {first}..{end})", buffer.id));
    }
}

/// Errors the soak's small caps make legitimate.
fn is_pressure(e: &Error) -> bool {
    matches!(e, Error::OutOfMemory { .. } | Error::WouldNeverFit { .. })
}

pub struct Worker<'a> {
    engine: &'a Engine,
    shared: &'a SharedBuffers,
    tally: &'a Tally,
    plan: &'a Plan,
    rng: rand_pcg::Pcg64,
    stream: StreamHandle,
    /// A `u32` in device memory the check kernels add differing words to.
    counter: DevicePtr,
    own: Vec<Buffer>,
    tickets: Vec<Ticket>,
    checks_since_sync: u32,
}

impl<'a> Worker<'a> {
    pub fn new(engine: &'a Engine, shared: &'a SharedBuffers, tally: &'a Tally, plan: &'a Plan, seed: u64) -> Self {
        Self {
            engine,
            shared,
            tally,
            plan,
            rng: rand_pcg::Pcg64::seed_from_u64(seed),
            stream: StreamHandle(0),
            counter: 0,
            own: Vec::new(),
            tickets: Vec::new(),
            checks_since_sync: 0,
        }
    }

    /// Runs random operations until `stop`, then checks and frees its buffers.
    pub fn run(mut self, stop: &AtomicBool) {
        let device = self.engine.device();
        let setup = device.create_stream(StreamPriority::High).and_then(|stream| {
            let counter = device.alloc_plain(4)?;
            device.write(counter, &[0; 4])?;
            Ok((stream, counter))
        });
        match setup {
            Ok((stream, counter)) => (self.stream, self.counter) = (stream, counter),
            Err(e) => return self.tally.unexpected(format!("soak thread setup: {e}")),
        }
        for _ in 0..self.plan.own_buffers {
            self.reallocate(None);
        }
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            self.step();
            n += 1;
            if n.is_multiple_of(16) {
                self.sync_and_count();
            }
        }
        self.finish_all();
        self.sync_and_count();
        for buffer in std::mem::take(&mut self.own) {
            verify_by_host(self.engine, &buffer, 0, buffer.blocks.len(), self.tally);
            if let Err(e) = self.engine.free(buffer.id) {
                self.tally.unexpected(format!("free of {}: {e}", buffer.id));
            }
        }
        let teardown = device.destroy_stream(self.stream).and_then(|()| device.free_plain(self.counter));
        if let Err(e) = teardown {
            self.tally.unexpected(format!("soak thread teardown: {e}"));
        }
    }

    fn step(&mut self) {
        let shared = !self.shared.0.is_empty() && self.rng.random_bool(0.2);
        match self.rng.random_range(0..100) {
            0..28 => self.on_some_buffer(shared, Kind::KernelWrite),
            28..48 => self.on_some_buffer(shared, Kind::KernelCheck),
            48..51 => self.discard_own(),
            51..58 => self.on_some_buffer(shared, Kind::HostWrite),
            58..66 => self.on_some_buffer(shared, Kind::HostRead),
            66..70 => self.move_own(Kind::Prefetch),
            70..74 => self.move_own(Kind::PageOut),
            74..78 => self.move_own(Kind::PageOutStart),
            78..81 => self.finish_one(),
            81..86 => self.move_own(Kind::PageIn),
            86..89 => self.move_own(Kind::Exchange),
            89..92 => self.move_own(if self.plan.has_file { Kind::PageOutToFile } else { Kind::PageOut }),
            92..95 => self.move_own(Kind::Step),
            95 => self.move_own(Kind::PassBegins),
            96 => self.move_own(Kind::Budget),
            97 => self.move_own(Kind::ReleaseIdle),
            _ => {
                let i = self.rng.random_range(0..self.own.len());
                self.reallocate(Some(i));
            }
        }
    }

    /// Runs a data operation on one of this thread's buffers or, holding its lock, a shared one.
    fn on_some_buffer(&mut self, shared: bool, kind: Kind) {
        self.tally.op(kind);
        if !shared {
            let i = self.rng.random_range(0..self.own.len());
            let mut buffer = std::mem::replace(&mut self.own[i], Buffer { id: BufferId(0), va: 0, blocks: Vec::new() });
            self.data_op(&mut buffer, kind);
            self.own[i] = buffer;
            return;
        }
        let shared = self.shared;
        let mut buffer = shared.0[self.rng.random_range(0..shared.0.len())].lock().unwrap_or_else(|p| p.into_inner());
        self.data_op(&mut buffer, kind);
        // The next thread to take this buffer must see this thread's work done.
        self.sync_and_count();
    }

    /// A random run of blocks that touches at most `region_chunks` chunks.
    fn region(&mut self, blocks: usize) -> (usize, usize) {
        let per_chunk = self.plan.blocks_per_chunk;
        let first = self.rng.random_range(0..blocks);
        let room = self.plan.region_chunks * per_chunk - first % per_chunk;
        let len = self.rng.random_range(1..=room.min(blocks - first));
        (first, first + len)
    }

    fn data_op(&mut self, buffer: &mut Buffer, kind: Kind) {
        let (first, end) = self.region(buffer.blocks.len());
        let span = Region::bytes(buffer.id, first * BLOCK, (end - first) * BLOCK);
        match kind {
            Kind::KernelWrite | Kind::KernelCheck => self.kernel_op(buffer, kind, span, first, end),
            Kind::HostRead => {
                self.sync_and_count();
                verify_by_host(self.engine, buffer, first, end, self.tally);
            }
            _ => {
                self.sync_and_count(); // kernels on this buffer's bytes end before the host writes
                let seed = new_seed(&mut self.rng);
                let mut bytes = vec![0u8; (end - first) * BLOCK];
                tiermem::mechanism::pattern::fill(seed, first * BLOCK, &mut bytes);
                match self.engine.write(buffer.id, first * BLOCK, &bytes) {
                    Ok(()) => buffer.blocks[first..end].fill(seed),
                    Err(e) => self.error("write", buffer.id, e),
                }
                // The host copy lands before this thread's next kernels read the bytes.
                if let Err(e) = self.engine.device().synchronize_stream(StreamHandle(0)) {
                    self.tally.unexpected(format!("synchronize the legacy stream: {e}"));
                }
            }
        }
    }

    fn kernel_op(&mut self, buffer: &mut Buffer, kind: Kind, span: Region, first: usize, end: usize) {
        let write = matches!(kind, Kind::KernelWrite);
        // Half the checks may read chunks where they lie in a neighbour's HBM (in place).
        let access = match write {
            true => Access::ReadWrite,
            false if self.rng.random_bool(0.5) => Access::InPlaceOk,
            false => Access::ReadOnly,
        };
        if let Err(e) = self.engine.acquire(&[span], access, self.stream) {
            return self.error("acquire", buffer.id, e);
        }
        let device = self.engine.device();
        let words = |from: usize, to: usize| (to - from) * BLOCK / 8;
        let launched = if write {
            let seed = new_seed(&mut self.rng);
            let at = buffer.va + (first * BLOCK) as u64;
            let launched =
                device.fill_pattern_async(at, words(first, end), seed, (first * BLOCK / 8) as u64, self.stream);
            if launched.is_ok() {
                buffer.blocks[first..end].fill(seed);
                self.tally.kernels(1);
            }
            launched
        } else {
            let mut launched = Ok(());
            // Zeros and discarded blocks (zeros or what they held) are checked by host reads.
            let checkable = |run: &(usize, usize, u64)| run.2 != ZEROS && run.2 & DISCARDED == 0;
            for (from, to, seed) in runs(&buffer.blocks, first, end).into_iter().filter(checkable) {
                let at = buffer.va + (from * BLOCK) as u64;
                let first_word = (from * BLOCK / 8) as u64;
                launched = device.check_pattern_async(at, words(from, to), seed, first_word, self.counter, self.stream);
                if launched.is_err() {
                    break;
                }
                self.tally.kernels(1);
                self.checks_since_sync += 1;
            }
            launched
        };
        if let Err(e) = launched {
            self.tally.unexpected(format!("kernel on {}: {e}", buffer.id));
        }
        if let Err(e) = self.engine.release(&[span], self.stream) {
            self.tally.unexpected(format!("release of {}: {e}", buffer.id));
        }
    }

    /// Moves one of this thread's buffers (or two, for an exchange), or enters its step.
    fn move_own(&mut self, kind: Kind) {
        self.tally.op(kind);
        let (a, b) = (self.rng.random_range(0..self.own.len()), self.rng.random_range(0..self.own.len()));
        let (id, other) = (self.own[a].id, self.own[b].id);
        let e = self.engine;
        let outcome = match kind {
            Kind::Prefetch => e.prefetch(&[Region::whole(id)]),
            Kind::PageOut => e.page_out(Target::Buffer(id)),
            Kind::PageOutStart => e.page_out_start(Target::Buffer(id)).map(|t| self.tickets.push(t)),
            Kind::PageIn => e.page_in(Target::Buffer(id)),
            Kind::Exchange if id != other => e.exchange(Target::Buffer(id), Target::Buffer(other)),
            Kind::Exchange => Ok(()),
            Kind::PageOutToFile => e.page_out_to_file(Target::Buffer(id)),
            // One schedule for the whole engine, whatever thread enters its steps: a step per
            // buffer, paging ahead as far as one operation acquires.
            Kind::Step => {
                e.step_enters(id.0, &[id], self.plan.region_chunks * self.plan.blocks_per_chunk * BLOCK).map(drop)
            }
            Kind::PassBegins => e.pass_begins(),
            // The node daemon's live budget: the threads' acquisitions (half the cap at most)
            // always fit; the excess leaves in the background (finished as a page-out is).
            Kind::Budget => {
                let chunks = self.rng.random_range(self.plan.hbm_chunks * 3 / 5..=self.plan.hbm_chunks);
                e.set_hbm_budget(chunks * self.plan.blocks_per_chunk * BLOCK).map(|t| self.tickets.push(t))
            }
            Kind::ReleaseIdle => e.release_idle_hbm().map(drop),
            _ => unreachable!("not a move"),
        };
        if let Err(err) = outcome {
            self.error("move", id, err);
        }
    }

    /// Discards a random run of blocks of one of this thread's buffers, never acquired between
    /// operations; its kernels may still be running (the engine drops the chunks behind them).
    fn discard_own(&mut self) {
        self.tally.op(Kind::Discard);
        let i = self.rng.random_range(0..self.own.len());
        let (first, end) = self.region(self.own[i].blocks.len());
        let id = self.own[i].id;
        match self.engine.discard(&[Region::bytes(id, first * BLOCK, (end - first) * BLOCK)]) {
            Ok(_) => self.own[i].blocks[first..end].iter_mut().for_each(|seed| *seed |= DISCARDED),
            Err(e) => self.error("discard", id, e),
        }
    }

    fn finish_one(&mut self) {
        self.tally.op(Kind::Finish);
        if !self.tickets.is_empty() {
            let ticket = self.tickets.swap_remove(self.rng.random_range(0..self.tickets.len()));
            if let Err(e) = self.engine.finish(ticket) {
                self.error("finish", BufferId(0), e);
            }
        }
    }

    fn finish_all(&mut self) {
        for ticket in std::mem::take(&mut self.tickets) {
            if let Err(e) = self.engine.finish(ticket) {
                self.error("finish", BufferId(0), e);
            }
        }
    }

    /// Frees buffer `i` (if given) and allocates a new one of random size in its place.
    fn reallocate(&mut self, i: Option<usize>) {
        self.tally.op(Kind::Reallocate);
        if let Some(i) = i {
            self.sync_and_count(); // pending checks read it
            let old = self.own.swap_remove(i);
            if let Err(e) = self.engine.free(old.id) {
                self.tally.unexpected(format!("free of {}: {e}", old.id));
            }
        }
        // Now and then consecutive parts of one reservation (`alloc_parts`), each a buffer of
        // its own, freed on its own, and together no larger than one buffer; a thread that
        // holds more buffers than planned (parts) frees without allocating until it does not.
        if self.own.len() >= self.plan.own_buffers && !self.own.is_empty() {
            return;
        }
        let parts = if self.rng.random_bool(0.25) { self.rng.random_range(2..=3) } else { 1 };
        let most = (self.plan.max_buffer_blocks / parts).max(1);
        let blocks: Vec<usize> = (0..parts).map(|_| self.rng.random_range(1..=most)).collect();
        let made = match parts {
            1 => alloc(self.engine, blocks[0]).map(|buffer| vec![buffer]),
            _ => {
                let sizes: Vec<usize> = blocks.iter().map(|b| b * BLOCK).collect();
                let made = self.engine.alloc_parts(&sizes, AllocOptions::default());
                made.map(|parts| {
                    let parts = parts.into_iter().zip(&blocks);
                    parts.map(|((id, va), &n)| Buffer { id, va, blocks: vec![ZEROS; n] }).collect()
                })
            }
        };
        match made {
            Ok(buffers) => self.own.extend(buffers),
            Err(e) => self.tally.unexpected(format!("alloc of {} parts of {blocks:?} blocks: {e}", blocks.len())),
        }
    }

    /// Waits for this thread's stream and counts what its check kernels found.
    fn sync_and_count(&mut self) {
        let device = self.engine.device();
        let mut count = [0u8; 4];
        let read = device.synchronize_stream(self.stream).and_then(|()| device.read(self.counter, &mut count));
        if let Err(e) = read {
            return self.tally.unexpected(format!("synchronize the soak's stream: {e}"));
        }
        let differing = u32::from_le_bytes(count);
        if differing > 0 {
            let what = format!("{differing} words differed in the last {} check kernels", self.checks_since_sync);
            self.tally.mismatch(u64::from(differing), what);
            if let Err(e) = device.write(self.counter, &[0; 4]) {
                self.tally.unexpected(format!("reset the check counter: {e}"));
            }
        }
        self.checks_since_sync = 0;
    }

    fn error(&self, call: &str, buffer: BufferId, e: Error) {
        match is_pressure(&e) {
            true => self.tally.pressure(),
            false => self.tally.unexpected(format!("{call} of {buffer}: {e}")),
        }
    }
}
