//! The façade: [`Engine`], the one lock over the engine's state (`Inner`), and the public
//! calls, each of which names itself in its errors. `Inner` plans each call (calls.rs) and
//! what moves where (placement.rs); its tiers (tiers.rs) do the moving, and its chunk table
//! (state.rs) alone changes chunk state. The module docs of lib.rs draw the layers.
//!
//! # Locking
//! Calls plan under the lock, wait without it, and commit under it: `finish` waits for fences
//! and background file writes with the lock released and commits under it; `acquire`,
//! `write`, `read`, `page_in_start`, `advance`, `page_out_start`, `page_out_to_file_start`,
//! `exchange_start`, `set_hbm_budget` and `free` run through `unlocked_waits`, so where they
//! must wait — for eviction's copies down, a page-out round, a host slot still read by a copy,
//! a buffer's transfers, or a file write spilling the full host tier (started in the
//! background, file_writes.rs) — they return what to wait for (`Error::MustWait`, internal),
//! wait with the lock released and run again, committing their spill first. `release` never
//! waits: what a shrunk budget would send down but cannot without waiting stays for a later
//! call. So an acquire of resident memory never waits for another thread's transfers or
//! spills (tests/unlocked_waits.rs, tests/spill_unlocked.rs). The schedule recorder
//! (recorder.rs) has its own lock, always taken before the engine's, never after. Only the
//! peer tier's reclaim and cleaning still wait while holding the lock (a lender asking for its
//! memory comes first); ARCHITECTURE.md ("Locking") lists every wait. The engine's own threads
//! (the file reader, file writers) never take the lock.

use crate::buffer::{Access, AllocOptions, BufferId, Region};
use crate::chunk_pool::ChunkPool;
use crate::error::retag;
use crate::error::Context;
use crate::fence::{EventPool, Fence};
use crate::file_tier::FileTier;
use crate::file_writes::{BackgroundWrites, Owner};
use crate::host_tier::HostTier;
use crate::in_flight::InFlight;
use crate::multipath::Multipath;
use crate::recorder::Recorder;
use crate::schedule::Schedule;
use crate::state::{ChunkRef, ChunkTable};
use crate::stats::Counters;
use crate::sync::{Arc, Mutex, MutexGuard};
use crate::tiers::{Streams, Tiers};
use crate::{EngineConfig, Error, Result};
use std::collections::HashMap;
use tiermem_mechanism::timing::{DriverTimes, TimedDevice};
use tiermem_mechanism::{Device, DeviceInfo, StreamHandle, StreamPriority};
use tiermem_policy::{new_policy, EvictionPolicy, PolicyKind};

/// What `page_in` and `page_out` act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Buffer(BufferId),
    All,
}

/// An asynchronous `page_in_start`, `page_out_start` or `exchange_start`; [`Engine::finish`] waits for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use = "an unfinished ticket leaves its transfer unwaited"]
pub struct Ticket(pub u64);

/// The tiermem engine for one GPU: buffers at stable device addresses whose chunks move
/// between local HBM and pinned host memory.
///
/// Thread safety: `Engine` is `Send + Sync`; calls are serialised on one internal lock, and
/// most wait for transfers with it released (see "Locking" in the module docs).
pub struct Engine {
    /// `timed`, as the engine and its threads use it.
    device: Arc<dyn Device>,
    /// The device wrapped in the timing adaptor: every driver call the engine makes is timed.
    timed: Arc<TimedDevice>,
    inner: Arc<Mutex<Inner>>,
    /// Gives borrowed HBM back when a lender needs it and keeps borrowed chunks clean
    /// (lender_watch.rs); started with the first lender (at the start, or a first lent slab).
    lender_watch: std::sync::Mutex<Option<crate::lender_watch::LenderWatch>>,
    /// Whether the lender watch cleans borrowed chunks (`EngineConfig::peer_clean`).
    peer_clean: bool,
    /// HBM each lender keeps free for its own users (`EngineConfig::peer_reserve`).
    pub(crate) peer_reserve: usize,
    /// Learns the schedule from the first pass (`pass_begins`, `step_enters`).
    pub(crate) recorder: Mutex<Recorder>,
    /// Acquires that wait for the budget to grow (budget_wait.rs).
    pub(crate) budget_wait: crate::budget_wait::BudgetWait,
    /// The HBM cap the engine started with (its own limit), which no budget exceeds.
    own_cap: usize,
    /// The window paged ahead along loops learned from acquires (`TIERMEM_LEARN_LOOPS`); `None`: off.
    pub(crate) learn_loops: Option<usize>,
    fallback: Option<String>,
    /// Why some GPUs do not lend to the peer tier (lenders.rs).
    pub(crate) peer_notes: Vec<String>,
}

pub(crate) struct Inner {
    /// Buffers and their chunks: the only writer of chunk state (state.rs).
    pub state: ChunkTable,
    /// The tiers and the machinery that moves chunks between them (tiers.rs).
    pub tiers: Tiers,
    pub policy: Box<dyn EvictionPolicy>,
    pub schedule: Option<Schedule>,
    pub tickets: HashMap<u64, TicketWork>,
    pub next_ticket: u64,
    /// Set while the façade runs a call that waits with the lock released
    /// (`Engine::unlocked_waits`): waits are returned to it instead of done here.
    pub wait_unlocked: bool,
    /// Each buffer's walk, for stride prefetch (stride.rs), and how far ahead it prefetches.
    pub strides: crate::stride::Strides,
    /// Chunks kept free or on their way down ahead of demand (pre_evict.rs); 0: off.
    pub pre_evict_chunks: usize,
    /// Paging ahead looks past resident steps for streamed chunks to swap in (schedule.rs).
    pub look_past: bool,
    /// `advance` plans the resident set, spread along the schedule (schedule.rs).
    pub spread_resident: bool,
    /// Paging ahead waits for its evictions (`TIERMEM_AHEAD_WAITS`; placement.rs, `bring_in`).
    pub ahead_waits: bool,
    /// Buffers allocated side by side in one reservation (parts.rs).
    pub parts: crate::parts::Parts,
}

/// What `finish` waits for: fences, the ticket's background file write if any (kept in
/// `Inner::writes`), then chunks to spill to the file tier (those the write covered move
/// without another write).
#[derive(Default)]
pub(crate) struct TicketWork {
    pub fences: Vec<Arc<Fence>>,
    pub then_to_file: Vec<ChunkRef>,
}

impl Engine {
    /// Opens the device that `config` names and sets up the tiers.
    pub fn new(config: EngineConfig) -> Result<Self> {
        // A simulated device is at least as large as the HBM cap asked of it.
        let sim_hbm = config.hbm_limit.map_or(config.sim_hbm, |limit| limit.max(config.sim_hbm));
        let sim = tiermem_mechanism::SimNode { gpus: config.sim_gpus, hbm_per_gpu: sim_hbm };
        let (device, fallback) =
            tiermem_mechanism::open_in_node(config.backend, config.device, sim).during("Engine::new")?;
        let mut engine = Self::with_device(device, &config)?;
        engine.fallback = fallback;
        Ok(engine)
    }

    /// An engine over an already opened device (tests use this with a `SimDevice`).
    pub fn with_device(device: Arc<dyn Device>, config: &EngineConfig) -> Result<Self> {
        // `None` (or any chunk up to one granule): the device itself.
        let chunk = config.chunk.unwrap_or(0);
        let untimed = tiermem_mechanism::chunked::ChunkedDevice::wrap(device, chunk).map_err(|e| match e {
            tiermem_mechanism::DeviceError::Config(message) => Error::Config(message),
            source => Error::Device { call: "Engine::new", source },
        })?;
        let timed = Arc::new(TimedDevice::new(untimed));
        let device: Arc<dyn Device> = timed.clone();
        let chunk = device.info().granularity;
        let (free, _) = device.mem_info().during("Engine::new")?;
        let caps = crate::limits::caps(config, device.info(), free)?;
        let lending = crate::lenders::peer_lending(device.as_ref(), config)?;
        let file = match &config.file {
            None => None,
            Some(path) => {
                crate::limits::check_file(path, config.file_limit)?;
                Some(FileTier::open(&device, config, path, chunk)?)
            }
        };
        let streams = Streams {
            up: device.create_stream(StreamPriority::High).during("Engine::new")?,
            down: device.create_stream(StreamPriority::High).during("Engine::new")?,
            prefetch: device.create_stream(StreamPriority::Low).during("Engine::new")?,
        };
        let mut notes = lending.notes;
        let lender_gpus: Vec<usize> = lending.lenders.iter().map(|&(gpu, _)| gpu).collect();
        let multipath = match config.multipath {
            true => {
                let (paths, why) = Multipath::open(device.as_ref(), &lender_gpus);
                notes.extend(why);
                paths
            }
            false => Multipath::none(device.info().ordinal),
        };
        let tiers = Tiers {
            device: Arc::clone(&device),
            chunk,
            batch: config.batch_chunks.max(1),
            pool: ChunkPool::new(caps.hbm / chunk),
            peer: crate::peer_tier::PeerTier::new(chunk, device.info().ordinal, &lending.lenders)
                .with_slots_readable_in_place(config.peer_in_place)
                .with_busy_rate(config.peer_busy_rate),
            multipath,
            host: HostTier::new(chunk, caps.host).pinning_ahead(config.evict_room),
            file,
            writes: BackgroundWrites::default(),
            events: EventPool::new(Arc::clone(&device)),
            streams,
            in_flight: InFlight::default(),
            counters: Counters::default(),
        };
        let inner = Inner {
            state: ChunkTable::new(chunk),
            tiers,
            policy: new_policy(config.policy, config.seed),
            schedule: None,
            tickets: HashMap::new(),
            next_ticket: 1,
            wait_unlocked: false,
            strides: crate::stride::Strides::new(config.stride_prefetch / chunk),
            pre_evict_chunks: config.pre_evict / chunk,
            look_past: config.look_past,
            spread_resident: config.spread_resident,
            ahead_waits: config.ahead_waits,
            parts: Default::default(),
        };
        let has_peers = inner.tiers.peer.exists();
        let inner = Arc::new(Mutex::new(inner));
        let peer_reserve = config.peer_reserve(device.info().backend);
        let lender_watch = match has_peers {
            true => {
                let started = crate::lender_watch::watch_lenders(&inner, peer_reserve, config.peer_clean);
                Some(started.map_err(|e| Error::Config(format!("Engine::new: no lender watch thread: {e}")))?)
            }
            false => None,
        };
        Ok(Self {
            device,
            timed,
            inner,
            lender_watch: std::sync::Mutex::new(lender_watch),
            peer_clean: config.peer_clean,
            peer_reserve,
            recorder: Mutex::new(Recorder::default()),
            budget_wait: Default::default(),
            own_cap: caps.hbm / chunk * chunk,
            learn_loops: config.learn_loops,
            fallback: None,
            peer_notes: notes,
        })
    }

    pub fn device_info(&self) -> &DeviceInfo {
        self.device.info()
    }

    /// The device itself, for callers that launch their own work (streams, copies); wrapped in
    /// the engine's timing adaptor, so driver calls made through it count in [`Engine::driver_times`].
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    /// Why `auto` fell back to the simulated device, if it did.
    pub fn fallback_reason(&self) -> Option<&str> {
        self.fallback.as_deref()
    }

    pub fn policy(&self) -> PolicyKind {
        self.lock().policy.kind()
    }

    /// The size of one chunk (the device's VMM granularity, or `TIERMEM_CHUNK`).
    pub fn chunk_size(&self) -> usize {
        self.lock().tiers.chunk
    }

    /// The HBM cap in bytes.
    pub fn hbm_cap(&self) -> usize {
        let g = self.lock();
        g.tiers.pool.cap() * g.tiers.chunk
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `op` under the lock; where it must wait for transfers (eviction's copies down, a
    /// host slot still read, a background file write spilling the host tier), it returns them
    /// instead ([`Error::MustWait`]), and this waits with the lock released and runs `op` again.
    /// A spill that `op` started is committed, under the lock, before `op` runs again; if its
    /// write failed, that is the call's error (its chunks kept their host copies). `op` must
    /// leave a consistent engine wherever it stops: what it did before stopping is kept (chunks
    /// sent down stay sent).
    pub(crate) fn unlocked_waits<T>(&self, mut op: impl FnMut(&mut Inner) -> Result<T>) -> Result<T> {
        let mut spilled: Option<(&'static str, u64)> = None;
        loop {
            let waits = {
                let mut guard = self.lock();
                let inner = &mut *guard;
                if let Some((call, spill)) = spilled.take() {
                    inner.tiers.commit_write_of(&mut inner.state, Owner::Spill(spill)).map_err(|e| retag(e, call))?;
                }
                inner.wait_unlocked = true;
                let outcome = op(inner);
                inner.wait_unlocked = false;
                match outcome {
                    Err(Error::MustWait(waits)) => waits,
                    other => return other,
                }
            };
            let started = std::time::Instant::now();
            // Every wait is waited out, even after a failed one: a spill is committed only after.
            let failed = waits.fences.iter().map(|fence| fence.wait().during(waits.call)).find_map(Result::err);
            waits.writes.iter().for_each(|done| done.wait());
            let mut guard = self.lock();
            guard.tiers.counters.evict_wait_ms += started.elapsed().as_secs_f64() * 1e3;
            spilled = waits.spill.map(|spill| (waits.call, spill));
            if let Some(failed) = failed {
                let inner = &mut *guard;
                if let Some((_, spill)) = spilled {
                    let _ = inner.tiers.commit_write_of(&mut inner.state, Owner::Spill(spill));
                }
                return Err(failed);
            }
        }
    }

    /// Allocates `size` bytes behind a device address that stays valid until `free`.
    /// Nothing is resident yet: each chunk reads as zeros when first made resident.
    pub fn alloc(&self, size: usize, options: AllocOptions) -> Result<(BufferId, u64)> {
        self.lock().alloc(size, options)
    }

    /// Buffers of `sizes` bytes at consecutive device addresses, each from a chunk boundary:
    /// a tensor used a slice at a time, each slice a buffer of its own (parts.rs). Each part
    /// is freed on its own; returns `(id, address)` per part.
    pub fn alloc_parts(&self, sizes: &[usize], options: AllocOptions) -> Result<Vec<(BufferId, u64)>> {
        self.lock().alloc_parts(sizes, options)
    }

    /// Frees a buffer, waiting (with the lock released) for any transfer of its chunks. The
    /// buffer must not be acquired.
    pub fn free(&self, buffer: BufferId) -> Result<()> {
        let freed = self.unlocked_waits(|inner| inner.free(buffer));
        self.budget_wait.tell();
        freed
    }

    /// Gives up the bytes of the chunks wholly inside `regions`, which the program no longer
    /// wants (discard.rs): their memory is freed with nothing copied, and the next acquire
    /// finds them as zeros without a page-in. Never waits; a chunk it cannot drop at once keeps
    /// its bytes, so the regions' bytes are undefined until written. The regions must not be
    /// acquired. Returns how many chunks gave their memory up.
    pub fn discard(&self, regions: &[Region]) -> Result<usize> {
        let dropped = self.lock().discard(regions);
        self.budget_wait.tell();
        dropped
    }

    /// The device address of a buffer.
    pub fn device_ptr(&self, buffer: BufferId) -> Result<u64> {
        Ok(self.lock().buffer("device_ptr", buffer)?.va)
    }

    /// Makes `regions` resident and keeps them so until `release`. Stream-ordered: missing
    /// chunks are copied on tiermem's copy stream and `stream` waits for them on the device;
    /// the host blocks only when HBM must first be freed by copying other chunks down.
    /// If everything is resident this makes no driver call, unless the acquire continues a walk
    /// through the buffer that stride prefetch brings the next chunks in for (stride.rs), or
    /// pre-eviction is on (pre_evict.rs), or the program's loop is being learned from its
    /// acquires (`TIERMEM_LEARN_LOOPS`: control.rs).
    ///
    /// With [`Engine::wait_for_budget`], one that fails for want of HBM waits (holding no lock)
    /// for the budget to grow or chunks to be released, and tries again (budget_wait.rs).
    pub fn acquire(&self, regions: &[Region], access: Access, stream: StreamHandle) -> Result<()> {
        self.learn_from(regions);
        let acquire = || self.unlocked_waits(|inner| inner.acquire(regions, access, stream));
        let may_help = |e: &Error| !self.beyond_own_cap(e) && self.hbm_cap() < self.own_cap;
        self.budget_wait.retrying(acquire, may_help).map_err(|e| match e {
            Error::WouldNeverFit { call, requested, .. } if self.beyond_own_cap(&e) => {
                Error::WouldNeverFit { call, requested, cap: self.own_cap }
            }
            e => e,
        })
    }

    /// Whether `e` refused an acquire larger than the engine's own cap, which no budget reaches.
    fn beyond_own_cap(&self, e: &Error) -> bool {
        matches!(e, Error::WouldNeverFit { requested, .. } if *requested > self.own_cap)
    }

    /// Ends an `acquire`: the chunks may move once the work enqueued on `stream` so far is done.
    /// If the HBM budget shrank while they were acquired, they leave first (calls.rs, "The HBM
    /// budget"), as far as that needs no wait: the release never waits.
    pub fn release(&self, regions: &[Region], stream: StreamHandle) -> Result<()> {
        let released = self.lock().release(regions, stream);
        self.budget_wait.tell();
        released
    }

    /// Starts bringing `regions` into HBM in the background, using only free HBM (a prefetch
    /// never evicts): demand and eviction come first.
    pub fn prefetch(&self, regions: &[Region]) -> Result<()> {
        self.lock().prefetch(regions)
    }

    /// Copies `target` into HBM (evicting others as needed) and waits.
    pub fn page_in(&self, target: Target) -> Result<()> {
        let ticket = self.page_in_start(target)?;
        self.finish(ticket)
    }

    pub fn page_in_start(&self, target: Target) -> Result<Ticket> {
        self.unlocked_waits(|inner| inner.page_in_start(target))
    }

    /// Moves `target` out of HBM into the host tier and waits. Clean chunks leave with
    /// no copy. Acquired buffers are refused.
    pub fn page_out(&self, target: Target) -> Result<()> {
        let ticket = self.page_out_start(target)?;
        self.finish(ticket)
    }

    pub fn page_out_start(&self, target: Target) -> Result<Ticket> {
        self.unlocked_waits(|inner| inner.page_out_start(target))
    }

    /// Moves `outgoing` out of HBM and `incoming` in, in one schedule that overlaps the two
    /// directions (as a schedule-driven program pages out the last layer and in the next), and
    /// waits. A buffer may not be in both.
    pub fn exchange(&self, outgoing: Target, incoming: Target) -> Result<()> {
        let ticket = self.exchange_start(outgoing, incoming)?;
        self.finish(ticket)
    }

    pub fn exchange_start(&self, outgoing: Target, incoming: Target) -> Result<Ticket> {
        // Run again after a wait, the incoming chunks brought in by an earlier run bring no
        // fences a second time: the fences of every run make the ticket.
        let mut fences = Vec::new();
        self.unlocked_waits(|inner| inner.exchange_start(outgoing, incoming, &mut fences))?;
        Ok(self.lock().ticket(fences))
    }

    /// Waits for an asynchronous page-in or page-out to complete.
    pub fn finish(&self, ticket: Ticket) -> Result<()> {
        let work =
            self.lock().tickets.remove(&ticket.0).ok_or(Error::UnknownTicket { call: "finish", ticket: ticket.0 })?;
        let mut failed_read = None;
        for fence in &work.fences {
            fence.wait().during("finish")?;
            failed_read = failed_read.or(fence.recorded().err());
            // Complete each group as soon as it lands, so unmapping overlaps later copies.
            let mut guard = self.lock();
            let inner = &mut *guard;
            inner.tiers.reap(&mut inner.state).map_err(|e| retag(e, "finish"))?;
        }
        // The write is waited for without the lock; another thread may complete it meanwhile.
        if let Some(done) = self.lock().tiers.writes.done_signal(Owner::Ticket(ticket.0)) {
            done.wait();
        }
        {
            let mut guard = self.lock();
            let inner = &mut *guard;
            inner.tiers.commit_write_of(&mut inner.state, Owner::Ticket(ticket.0)).map_err(|e| retag(e, "finish"))?;
        }
        if let Some(failure) = failed_read {
            // The chunks that did not arrive go back to the file, which still holds their bytes.
            let mut guard = self.lock();
            let inner = &mut *guard;
            let all = inner.target_refs("finish", Target::All)?;
            inner.tiers.undo_failed_reads(&mut inner.state, &all);
            return Err(retag(failure, "finish"));
        }
        if work.then_to_file.is_empty() {
            return Ok(());
        }
        // What the background write did not cover is spilled now (rare), its write waited for
        // with the lock released; buffers freed since the start have nothing left to move.
        self.unlocked_waits(|inner| {
            inner.tiers.reap(&mut inner.state)?;
            inner.spill("finish", &work.then_to_file)
        })
    }

    /// Moves `target` out of HBM and out of the host tier into the file tier, and waits.
    /// Chunks whose bytes the file already holds are not written again.
    pub fn page_out_to_file(&self, target: Target) -> Result<()> {
        let ticket = self.page_out_to_file_start(target)?;
        self.finish(ticket)
    }

    /// Starts the copies out of HBM and, in the background, the file write after them; returns
    /// at once. `finish` waits for both and drops the host copies the file now holds.
    pub fn page_out_to_file_start(&self, target: Target) -> Result<Ticket> {
        self.unlocked_waits(|inner| inner.page_out_to_file_start(target))
    }

    /// Writes `data` at `offset` of `buffer` from ordinary host memory (making it resident).
    /// A range larger than the HBM cap is written in windows that fit, one after another; if
    /// one fails after others were written, [`Error::PartlyWritten`] says how far it got.
    pub fn write(&self, buffer: BufferId, offset: usize, data: &[u8]) -> Result<()> {
        for (at, len) in self.windows(buffer, offset, data.len()) {
            let piece = &data[at - offset..at - offset + len];
            let region = Region::bytes(buffer, at, len);
            self.host_copy("write", region, Access::ReadWrite, |va| self.device.write(va, piece)).map_err(
                |e| match at - offset {
                    0 => e,
                    written => Error::PartlyWritten { call: "write", written, source: Box::new(e) },
                },
            )?;
        }
        Ok(())
    }

    /// Reads `out.len()` bytes at `offset` of `buffer` into ordinary host memory, in windows
    /// that fit the HBM cap.
    pub fn read(&self, buffer: BufferId, offset: usize, out: &mut [u8]) -> Result<()> {
        for (at, len) in self.windows(buffer, offset, out.len()) {
            let piece = &mut out[at - offset..at - offset + len];
            let region = Region::bytes(buffer, at, len);
            self.host_copy("read", region, Access::ReadOnly, |va| self.device.read(va, piece))?;
        }
        Ok(())
    }

    /// `len` bytes at `offset` in windows of at most the HBM cap (see [`crate::buffer::windows`]).
    /// A range outside the buffer is one window, for the acquire to refuse.
    fn windows(&self, buffer: BufferId, offset: usize, len: usize) -> Vec<(usize, usize)> {
        let inner = self.lock();
        let size = inner.state.buffer(buffer).map_or(0, |b| b.size);
        match offset.checked_add(len).is_some_and(|end| end <= size) {
            true => crate::buffer::windows(offset, len, inner.tiers.chunk * inner.tiers.pool.cap().max(1)),
            false => vec![(offset, len)],
        }
    }

    /// Acquires `region` on the legacy stream, runs a synchronous copy at its device address
    /// (which the legacy stream orders after any page-in), and releases it.
    fn host_copy(
        &self,
        call: &'static str,
        region: Region,
        access: Access,
        copy: impl FnOnce(u64) -> tiermem_mechanism::Result<()>,
    ) -> Result<()> {
        let (regions, stream) = ([region], StreamHandle(0));
        let va = self.unlocked_waits(|inner| inner.acquire_for_host(&regions, access, stream, call))?;
        let copied = copy(va + region.offset as u64).during(call);
        self.release(&regions, stream)?;
        copied
    }

    /// Statistics: tiers, transfers, per-buffer residency.
    pub fn stats(&self) -> crate::Stats {
        self.snapshot(true)
    }

    /// The statistics without per-buffer residency (`buffers` empty): a step per buffer, not a
    /// pass over every chunk, under the engine's lock — what the node daemon's link reads
    /// every 50 ms.
    pub fn summary(&self) -> crate::Stats {
        self.snapshot(false)
    }

    fn snapshot(&self, per_buffer: bool) -> crate::Stats {
        let g = self.lock();
        crate::Stats::collect(
            crate::stats::Sources {
                state: &g.state,
                hbm: &g.tiers.pool,
                peer: &g.tiers.peer,
                host: &g.tiers.host,
                file: g.tiers.file.as_ref().map(|tier| tier.store.as_ref()),
                policy: g.policy.kind(),
                counters: &g.tiers.counters,
                driver: &self.timed.times(),
            },
            per_buffer,
        )
    }

    /// The wall time spent in each kind of memory-management driver call the engine has made
    /// (`Stats` reports map and unmap time from these).
    pub fn driver_times(&self) -> DriverTimes {
        self.timed.times()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.lender_watch.lock().unwrap_or_else(|p| p.into_inner()).take();
        let mut inner = self.lock();
        match inner.shutdown() {
            // The process is exiting and the driver has already let go of everything.
            Err(e) if e.is_driver_shutdown() => {}
            Err(e) => eprintln!("tiermem: error while releasing device resources: {e}"),
            Ok(()) => {}
        }
    }
}

impl Engine {
    /// Starts the lender watch if it is not running (a first slab lent by another process).
    pub(crate) fn ensure_lender_watch(&self) -> Result<()> {
        let mut watch = self.lender_watch.lock().unwrap_or_else(|p| p.into_inner());
        if watch.is_none() {
            let started = crate::lender_watch::watch_lenders(&self.inner, self.peer_reserve, self.peer_clean);
            *watch = Some(started.map_err(|e| Error::Config(format!("no lender watch thread: {e}")))?);
        }
        Ok(())
    }
}
