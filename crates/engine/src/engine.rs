use crate::buffer::{Access, AllocOptions, Buffer, BufferId, Region};
use crate::chunk::{Chunk, ChunkState};
use crate::chunk_pool::ChunkPool;
use crate::error::Context;
use crate::fence::{EventPool, Fence};
use crate::file_reads::FileReader;
use crate::file_tier::FileTier;
use crate::file_writes::BackgroundWrites;
use crate::host_tier::{HostTier, Slot};
use crate::schedule::Schedule;
use crate::stats::Counters;
use crate::sync::{Arc, Mutex, MutexGuard};
use crate::{EngineConfig, Error, Result};
use std::collections::{BTreeMap, HashMap, VecDeque};
use tiermem_mechanism::{Device, DeviceInfo, PhysHandle, StreamHandle, StreamPriority};
use tiermem_policy::{new_policy, EvictionPolicy, PolicyKind};

/// A chunk: its buffer and its index in the buffer.
pub(crate) type ChunkRef = (BufferId, usize);

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
/// Thread safety: `Engine` is `Send + Sync`; calls are serialised on one internal lock,
/// except `finish`, which waits with the lock released.
pub struct Engine {
    device: Arc<dyn Device>,
    inner: Mutex<Inner>,
    fallback: Option<String>,
}

pub(crate) struct Streams {
    pub up: StreamHandle,
    pub down: StreamHandle,
    pub prefetch: StreamHandle,
}

/// A group of chunks moving down behind one fence.
pub(crate) struct PendingDown {
    pub fence: Arc<Fence>,
    pub chunks: Vec<ChunkRef>,
}

pub(crate) struct Inner {
    pub device: Arc<dyn Device>,
    pub chunk: usize,
    pub batch: usize,
    pub buffers: BTreeMap<BufferId, Buffer>,
    pub next_buffer: u64,
    pub clock: u64,
    /// Chunks acquired at least once (`pins > 0`): HBM that eviction cannot free.
    pub pinned: usize,
    pub pool: ChunkPool,
    /// The chunk each physical chunk in use serves (`Device` or `PagingOut`): homes.rs.
    pub holders: HashMap<PhysHandle, ChunkRef>,
    pub host: HostTier,
    pub policy: Box<dyn EvictionPolicy>,
    pub events: Arc<EventPool>,
    pub streams: Streams,
    pub pending_down: Vec<PendingDown>,
    /// Host slots to free once a copy still reading them has finished.
    pub retiring: VecDeque<(Arc<Fence>, Slot)>,
    /// Demand transfers whose device time is added to `Counters::stall_ms` once complete.
    pub timings: VecDeque<(Arc<Fence>, Arc<Fence>)>,
    pub tickets: HashMap<u64, TicketWork>,
    /// The background file writes of tickets (file_writes.rs).
    pub writes: BackgroundWrites,
    pub next_ticket: u64,
    pub counters: Counters,
    pub file: Option<FileTier>,
    pub schedule: Option<Schedule>,
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
        let (device, fallback) =
            tiermem_mechanism::open(config.backend, config.device, sim_hbm).during("Engine::new")?;
        let mut engine = Self::with_device(device, &config)?;
        engine.fallback = fallback;
        Ok(engine)
    }

    /// An engine over an already opened device (tests use this with a `SimDevice`).
    pub fn with_device(device: Arc<dyn Device>, config: &EngineConfig) -> Result<Self> {
        let chunk = device.info().granularity;
        let (free, _) = device.mem_info().during("Engine::new")?;
        let caps = crate::limits::caps(config, device.info(), free)?;
        let file = match &config.file {
            None => None,
            Some(path) => {
                crate::limits::check_file(path, config.file_limit)?;
                Some(open_file_tier(&device, config, path, chunk)?)
            }
        };
        let streams = Streams {
            up: device.create_stream(StreamPriority::High).during("Engine::new")?,
            down: device.create_stream(StreamPriority::High).during("Engine::new")?,
            prefetch: device.create_stream(StreamPriority::Low).during("Engine::new")?,
        };
        let inner = Inner {
            device: Arc::clone(&device),
            chunk,
            batch: config.batch_chunks.max(1),
            buffers: BTreeMap::new(),
            next_buffer: 1,
            clock: 0,
            pinned: 0,
            pool: ChunkPool::new(caps.hbm / chunk),
            holders: HashMap::new(),
            host: HostTier::new(chunk, caps.host),
            policy: new_policy(config.policy, config.seed),
            events: EventPool::new(Arc::clone(&device)),
            streams,
            pending_down: Vec::new(),
            retiring: VecDeque::new(),
            timings: VecDeque::new(),
            tickets: HashMap::new(),
            writes: BackgroundWrites::default(),
            next_ticket: 1,
            counters: Counters::default(),
            file,
            schedule: None,
        };
        Ok(Self { device, inner: Mutex::new(inner), fallback: None })
    }

    pub fn device_info(&self) -> &DeviceInfo {
        self.device.info()
    }

    /// The device itself, for callers that launch their own work (streams, copies).
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

    /// The size of one chunk (the device's VMM granularity).
    pub fn chunk_size(&self) -> usize {
        self.lock().chunk
    }

    /// The HBM cap in bytes.
    pub fn hbm_cap(&self) -> usize {
        let g = self.lock();
        g.pool.cap() * g.chunk
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Allocates `size` bytes behind a device address that stays valid until `free`.
    /// Nothing is resident yet: each chunk reads as zeros when first made resident.
    pub fn alloc(&self, size: usize, options: AllocOptions) -> Result<(BufferId, u64)> {
        self.lock().alloc(size, options)
    }

    /// Frees a buffer, waiting for any transfer of its chunks. The buffer must not be acquired.
    pub fn free(&self, buffer: BufferId) -> Result<()> {
        self.lock().free(buffer)
    }

    /// The device address of a buffer.
    pub fn device_ptr(&self, buffer: BufferId) -> Result<u64> {
        Ok(self.lock().buffer("device_ptr", buffer)?.va)
    }

    /// Makes `regions` resident and keeps them so until `release`. Stream-ordered: missing
    /// chunks are copied on tiermem's copy stream and `stream` waits for them on the device;
    /// the host blocks only when HBM must first be freed by copying other chunks down.
    /// If everything is resident this makes no driver call.
    pub fn acquire(&self, regions: &[Region], access: Access, stream: StreamHandle) -> Result<()> {
        self.lock().acquire(regions, access, stream)
    }

    /// Ends an `acquire`: the chunks may move once the work enqueued on `stream` so far is done.
    pub fn release(&self, regions: &[Region], stream: StreamHandle) -> Result<()> {
        self.lock().release(regions, stream)
    }

    /// Starts bringing `regions` into HBM in the background, using only free HBM (a prefetch
    /// never evicts): demand and eviction come first.
    pub fn prefetch(&self, regions: &[Region]) -> Result<()> {
        self.lock().prefetch(regions)
    }

    /// Tells the engine the order in which the program uses its buffers: a cycle of steps, each
    /// the buffers one step uses (e.g. one model layer each). Until [`Engine::clear_schedule`],
    /// eviction takes the chunk whose next use is furthest away (Belady), and
    /// [`Engine::advance`] pages ahead along it. The position starts at step 0.
    pub fn set_schedule(&self, steps: Vec<Vec<BufferId>>) -> Result<()> {
        let mut inner = self.lock();
        for &id in steps.iter().flatten() {
            inner.buffer("set_schedule", id)?;
        }
        if steps.is_empty() {
            return Err(Error::Schedule { call: "set_schedule", detail: "a schedule needs at least one step".into() });
        }
        inner.schedule = Some(Schedule::new(steps));
        inner.buffers.values_mut().flat_map(|b| &mut b.chunks).for_each(|c| c.streamed = false);
        Ok(())
    }

    /// Forgets the schedule: eviction goes back to the engine's policy.
    pub fn clear_schedule(&self) {
        self.lock().schedule = None;
    }

    /// Tells the engine the program is at `step` of its schedule, and starts paging in what is
    /// missing from a window of this and the coming steps, `prefetch_bytes` of them, nearest
    /// first. Evicts only chunks needed later than what it brings in, waiting for the GPU to
    /// finish with them (so a caller that advances before each step runs at the GPU's pace);
    /// never waits for the copies it starts. Returns the bytes it started copying.
    pub fn advance(&self, step: usize, prefetch_bytes: usize) -> Result<usize> {
        self.lock().advance(step, prefetch_bytes)
    }

    /// Copies `target` into HBM (evicting others as needed) and waits.
    pub fn page_in(&self, target: Target) -> Result<()> {
        let ticket = self.page_in_start(target)?;
        self.finish(ticket)
    }

    pub fn page_in_start(&self, target: Target) -> Result<Ticket> {
        self.lock().page_in_start(target)
    }

    /// Gives the HBM of idle physical chunks back to the driver (for other users of the GPU)
    /// and returns its bytes. Stale mappings of them are unmapped first; chunks brought in
    /// later are created afresh, so the next pass maps again. Data is untouched.
    pub fn release_idle_hbm(&self) -> Result<usize> {
        let mut inner = self.lock();
        inner.reap()?;
        Ok(inner.release_idle_beyond("release_idle_hbm", 0)? * inner.chunk)
    }

    /// Changes the HBM budget (the cap) to `bytes`, whole chunks, while the engine runs. A larger
    /// budget is used from the next page-in on. A smaller one is met without waiting: no chunk
    /// is handed out while more are in use than it allows, and the excess is sent down at once
    /// (acquired chunks as they are released) and its HBM given back to the driver as the
    /// copies land. `finish` on the ticket waits for those copies. See budget.rs.
    pub fn set_hbm_budget(&self, bytes: usize) -> Result<Ticket> {
        let mut inner = self.lock();
        let fences = inner.set_hbm_budget(bytes)?;
        Ok(inner.ticket(fences))
    }

    /// Moves `target` out of HBM into the host tier and waits. Clean chunks leave with
    /// no copy. Acquired buffers are refused.
    pub fn page_out(&self, target: Target) -> Result<()> {
        let ticket = self.page_out_start(target)?;
        self.finish(ticket)
    }

    pub fn page_out_start(&self, target: Target) -> Result<Ticket> {
        self.lock().page_out_start(target)
    }

    /// Moves `outgoing` out of HBM and `incoming` in, in one schedule that overlaps the two
    /// directions (as a schedule-driven program pages out the last layer and in the next), and
    /// waits. A buffer may not be in both.
    pub fn exchange(&self, outgoing: Target, incoming: Target) -> Result<()> {
        let ticket = self.exchange_start(outgoing, incoming)?;
        self.finish(ticket)
    }

    pub fn exchange_start(&self, outgoing: Target, incoming: Target) -> Result<Ticket> {
        self.lock().exchange_start(outgoing, incoming)
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
            self.lock().reap().map_err(|e| retag(e, "finish"))?;
        }
        // The write is waited for without the lock; another thread may complete it meanwhile.
        if let Some(done) = self.lock().writes.done_signal(ticket.0) {
            done.wait();
        }
        self.lock().commit_write_of(ticket.0).map_err(|e| retag(e, "finish"))?;
        if let Some(failure) = failed_read {
            // The chunks that did not arrive go back to the file, which still holds their bytes.
            let mut inner = self.lock();
            let all = inner.target_refs("finish", Target::All)?;
            inner.undo_failed_reads(&all);
            return Err(retag(failure, "finish"));
        }
        if work.then_to_file.is_empty() {
            return Ok(());
        }
        let mut inner = self.lock();
        inner.reap()?;
        // Buffers freed since the start have nothing left to move.
        let live: Vec<ChunkRef> = work.then_to_file.into_iter().filter(|r| inner.buffers.contains_key(&r.0)).collect();
        inner.spill_chunks("finish", &live)
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
        self.lock().page_out_to_file_start(target)
    }

    /// Writes `data` at `offset` of `buffer` from ordinary host memory (making it resident).
    pub fn write(&self, buffer: BufferId, offset: usize, data: &[u8]) -> Result<()> {
        let region = Region::bytes(buffer, offset, data.len());
        self.host_copy("write", region, Access::ReadWrite, |at| self.device.write(at, data))
    }

    /// Reads `out.len()` bytes at `offset` of `buffer` into ordinary host memory.
    pub fn read(&self, buffer: BufferId, offset: usize, out: &mut [u8]) -> Result<()> {
        let region = Region::bytes(buffer, offset, out.len());
        self.host_copy("read", region, Access::ReadOnly, |at| self.device.read(at, out))
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
        let va = self.lock().acquire_for_host(&regions, access, stream, call)?;
        let copied = copy(va + region.offset as u64).during(call);
        self.release(&regions, stream)?;
        copied
    }

    /// For tests: about one file read or write in `one_in` fails with `EIO` from now on (the
    /// same ones for the same `seed`); `None` stops it. Nothing happens without a file tier.
    /// Engine calls then fail with [`Error::File`] and, as for any I/O error, lose no byte.
    pub fn inject_file_errors(&self, one_in: Option<u64>, seed: u64) {
        if let Some(tier) = self.lock().file.as_ref() {
            tier.store.inject_errors(one_in, seed);
        }
    }

    /// Statistics: tiers, transfers, per-buffer residency.
    pub fn stats(&self) -> crate::Stats {
        self.lock().stats()
    }
}

/// Re-attributes an engine error raised inside a helper to the public call.
fn retag(error: Error, call: &'static str) -> Error {
    match error {
        Error::Device { source, .. } => Error::Device { call, source },
        Error::OutOfMemory { detail, .. } => Error::OutOfMemory { call, detail },
        Error::File { source, .. } => Error::File { call, source },
        other => other,
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = inner.shutdown() {
            eprintln!("tiermem: error while releasing device resources: {e}");
        }
    }
}

/// Creates the file tier's store (one slot per chunk) and its background reader.
fn open_file_tier(
    device: &Arc<dyn Device>,
    config: &EngineConfig,
    path: &std::path::Path,
    chunk: usize,
) -> Result<FileTier> {
    use tiermem_mechanism::file_store::{FileStore, FileStoreConfig};
    let store = FileStore::open(FileStoreConfig {
        path: path.to_owned(),
        capacity: config.file_limit / chunk * chunk,
        slot_size: chunk,
        queue_depth: config.file_queue_depth.max(1),
        io: config.file_io,
    })
    .map_err(|source| Error::File { call: "Engine::new", source })?;
    let store = Arc::new(store);
    let group_chunks = crate::file_reads::GROUP_BATCHES * config.batch_chunks.max(1);
    let reader = FileReader::start(Arc::clone(device), Arc::clone(&store), group_chunks)?;
    Ok(FileTier { store, reader })
}

impl Inner {
    pub fn buffer(&self, call: &'static str, id: BufferId) -> Result<&Buffer> {
        self.buffers.get(&id).ok_or(Error::UnknownBuffer { call, buffer: id })
    }

    pub fn chunk_mut(&mut self, (id, index): ChunkRef) -> &mut Chunk {
        &mut self.buffers.get_mut(&id).expect("chunk of a live buffer").chunks[index]
    }

    fn alloc(&mut self, size: usize, options: AllocOptions) -> Result<(BufferId, u64)> {
        if size == 0 {
            return Err(Error::ZeroSize { call: "alloc" });
        }
        let file_cap = self.file.as_ref().map_or(0, |tier| tier.store.capacity_slots());
        let all_tiers = (self.pool.cap() + self.host.cap() + file_cap) * self.chunk;
        if size > all_tiers {
            return Err(Error::OutOfMemory {
                call: "alloc",
                detail: format!(
                    "{size} bytes exceed all tiers together ({all_tiers} bytes: {})",
                    self.describe_tiers()
                ),
            });
        }
        let reserved = size.next_multiple_of(self.chunk);
        let va = self.device.reserve(reserved).during("alloc")?;
        let id = BufferId(self.next_buffer);
        self.next_buffer += 1;
        let chunks = (0..reserved / self.chunk).map(|_| Chunk::new()).collect();
        self.buffers.insert(id, Buffer { va, size, reserved, options, chunks, mapped: 0 });
        Ok((id, va))
    }

    fn free(&mut self, id: BufferId) -> Result<()> {
        let buffer = self.buffer("free", id)?;
        let pinned_chunks = buffer.chunks.iter().filter(|c| c.pins > 0).count();
        if pinned_chunks > 0 {
            return Err(Error::Acquired { call: "free", buffer: id, pinned_chunks });
        }
        for chunk in &buffer.chunks {
            let moving = match &chunk.state {
                ChunkState::PagingOut { fence, .. } => Some(fence),
                _ => None,
            };
            for fence in [&chunk.ready, &chunk.busy].into_iter().flatten().chain(moving) {
                fence.wait().during("free")?;
            }
        }
        // Unmap first, with the buffer still here: if cuMemUnmap fails the buffer stays and a
        // retry unmaps only what is still mapped. Its data is being discarded.
        let (va, reserved) = (buffer.va, buffer.reserved);
        self.unmap_buffer(id).during("free")?;
        self.device.unreserve(va, reserved).during("free")?;
        let buffer = self.buffers.remove(&id).expect("checked above");
        if let Some(schedule) = self.schedule.as_mut() {
            schedule.forget(id);
        }
        let mut file_slots = Vec::new();
        for chunk in buffer.chunks {
            if let ChunkState::Host { slot } = chunk.state {
                self.host.free(slot);
            }
            file_slots.extend(chunk.file);
        }
        self.free_file_slots(&file_slots);
        Ok(())
    }

    /// The distinct chunks `regions` cover, sorted; validates every region first.
    pub fn resolve(&self, call: &'static str, regions: &[Region]) -> Result<Vec<ChunkRef>> {
        let mut refs = Vec::new();
        for region in regions {
            let buffer = self.buffer(call, region.buffer)?;
            let len = region.len.unwrap_or(buffer.size.saturating_sub(region.offset));
            let end = region.offset.checked_add(len).filter(|&end| end <= buffer.size);
            let Some(end) = end.filter(|_| len > 0 || region.len.is_none()) else {
                return Err(Error::OutOfRange {
                    call,
                    buffer: region.buffer,
                    offset: region.offset,
                    len,
                    size: buffer.size,
                });
            };
            if len == 0 {
                continue;
            }
            let (first, last) = (region.offset / self.chunk, (end - 1) / self.chunk);
            refs.extend((first..=last).map(|i| (region.buffer, i)));
        }
        if regions.len() > 1 {
            refs.sort_unstable();
            refs.dedup();
        }
        Ok(refs)
    }

    fn acquire(&mut self, regions: &[Region], access: Access, stream: StreamHandle) -> Result<()> {
        let refs = self.resolve("acquire", regions)?;
        if access == Access::ReadWrite {
            if let Some(r) = regions.iter().find(|r| self.buffers[&r.buffer].options.read_only) {
                return Err(Error::ReadOnly { call: "acquire", buffer: r.buffer });
            }
        }
        self.check_fits("acquire", &refs)?;
        if refs.iter().any(|&r| !self.chunk_mut(r).is_resident()) {
            self.reap()?;
            self.bring_in("acquire", &refs, crate::movement::Purpose::Demand)?;
        }
        self.pin("acquire", &refs, access, stream)
    }

    /// `acquire` for a synchronous host copy: returns the buffer's address.
    fn acquire_for_host(
        &mut self,
        regions: &[Region],
        access: Access,
        stream: StreamHandle,
        call: &'static str,
    ) -> Result<u64> {
        let refs = self.resolve(call, regions)?;
        self.check_fits(call, &refs)?;
        self.reap()?;
        self.bring_in(call, &refs, crate::movement::Purpose::Demand)?;
        self.pin(call, &refs, access, stream)?;
        Ok(self.buffers[&regions[0].buffer].va)
    }

    /// Refuses `chunks` chunks that could never be resident at once, whatever is evicted.
    fn check_cap(&self, call: &'static str, chunks: usize) -> Result<()> {
        let cap = self.pool.cap();
        if chunks > cap {
            return Err(Error::WouldNeverFit { call, requested: chunks * self.chunk, cap: cap * self.chunk });
        }
        Ok(())
    }

    /// Refuses an acquire that could never be resident, or not while others hold their pins.
    fn check_fits(&mut self, call: &'static str, refs: &[ChunkRef]) -> Result<()> {
        self.check_cap(call, refs.len())?;
        let already = refs.iter().filter(|&&r| self.chunk_mut(r).pins > 0).count();
        if self.pinned - already + refs.len() > self.pool.cap() {
            return Err(Error::OutOfMemory {
                call,
                detail: format!(
                    "{} bytes requested while {} bytes are acquired by others; {}",
                    refs.len() * self.chunk,
                    (self.pinned - already) * self.chunk,
                    self.describe_tiers()
                ),
            });
        }
        Ok(())
    }

    /// Pins resident chunks and makes `stream` wait for those still arriving. Refused, pinning
    /// nothing, if a read from the file for any of them failed.
    fn pin(&mut self, call: &'static str, refs: &[ChunkRef], access: Access, stream: StreamHandle) -> Result<()> {
        if let Some(failure) = self.undo_failed_reads(refs) {
            return Err(retag(failure, call));
        }
        self.clock += 1;
        let clock = self.clock;
        let mut waits: Vec<Arc<Fence>> = Vec::new();
        for &r in refs {
            let chunk = self.chunk_mut(r);
            if let Some(fence) = &chunk.ready {
                if fence.is_done().during("acquire")? {
                    chunk.ready = None;
                } else if !waits.iter().any(|w| Arc::ptr_eq(w, fence)) {
                    waits.push(Arc::clone(fence));
                }
            }
        }
        for fence in &waits {
            self.device.stream_wait_event(stream, fence.event()).during("acquire")?;
        }
        for &r in refs {
            let chunk = self.chunk_mut(r);
            chunk.pins += 1;
            chunk.last_use = clock;
            let newly_pinned = chunk.pins == 1;
            if access == Access::ReadWrite {
                let stale_file = chunk.file.take();
                if let ChunkState::Device { copy, .. } = &mut chunk.state {
                    if let Some(slot) = copy.take() {
                        let reader = chunk.ready.clone();
                        self.retire(slot, reader);
                    }
                }
                // Its read from the file, if any, is done: `undo_failed_reads` waited for it.
                self.free_file_slots(stale_file.as_slice());
            }
            // `pinned` counts chunks, not pins: a chunk acquired twice takes one chunk of HBM.
            self.pinned += usize::from(newly_pinned);
        }
        Ok(())
    }

    /// Sends back to `File` those of `refs` whose background read from the file failed: their
    /// bytes are still in the file, their HBM goes back to the pool. Waits for reads not yet
    /// done with the disk. Returns the first failure.
    pub fn undo_failed_reads(&mut self, refs: &[ChunkRef]) -> Option<Error> {
        let mut failure = None;
        let mut undo = Vec::new();
        for &r in refs {
            let chunk = self.chunk_mut(r);
            let Some(Err(e)) = chunk.ready.as_ref().map(|fence| fence.recorded()) else { continue };
            if let ChunkState::Device { phys, .. } = chunk.state {
                undo.push((r, phys, None));
            }
            failure.get_or_insert(e);
        }
        self.detach_chunks(&undo);
        failure
    }

    /// Frees a host slot now, or once `reader` (a copy from it) has completed.
    pub fn retire(&mut self, slot: Slot, reader: Option<Arc<Fence>>) {
        match reader {
            Some(fence) if !matches!(fence.is_done(), Ok(true)) => self.retiring.push_back((fence, slot)),
            _ => self.host.free(slot),
        }
    }

    fn release(&mut self, regions: &[Region], stream: StreamHandle) -> Result<()> {
        let refs = self.resolve("release", regions)?;
        if let Some(&(buffer, index)) = refs.iter().find(|&&r| self.chunk_mut(r).pins == 0) {
            let (offset, len) = (index * self.chunk, self.chunk);
            return Err(Error::NotAcquired { buffer, offset, len });
        }
        let fence = self.events.record(stream).during("release")?;
        for &r in &refs {
            let chunk = self.chunk_mut(r);
            chunk.pins -= 1;
            chunk.busy = Some(Arc::clone(&fence));
            let unpinned = chunk.pins == 0;
            self.pinned -= usize::from(unpinned);
        }
        if self.over_budget() {
            // The budget shrank while these were acquired: they leave first (budget.rs). The
            // release itself is done: if they cannot leave now (the tiers below are full, or
            // the driver fails), they stay until a later call makes room.
            let _ = self.shed_excess("release", &refs);
        }
        Ok(())
    }

    fn prefetch(&mut self, regions: &[Region]) -> Result<()> {
        let refs = self.resolve("prefetch", regions)?;
        self.reap()?;
        self.bring_in("prefetch", &refs, crate::movement::Purpose::Prefetch)?;
        Ok(())
    }

    fn advance(&mut self, step: usize, budget: usize) -> Result<usize> {
        let call = "advance";
        let Some(schedule) = self.schedule.as_mut() else {
            return Err(Error::Schedule { call, detail: "no schedule is set (Engine::set_schedule)".into() });
        };
        if step >= schedule.len() {
            let detail = format!("step {step} is outside the schedule of {} steps", schedule.len());
            return Err(Error::Schedule { call, detail });
        }
        schedule.set_position(step);
        self.reap()?;
        // The window: the coming steps, nearest first, until their chunks (resident or not)
        // reach the budget; what is missing there is brought in.
        let mut plan: Vec<(u64, Vec<ChunkRef>)> = Vec::new();
        let mut window = 0;
        let schedule = self.schedule.as_ref().expect("checked above");
        'steps: for (distance, ids) in schedule.ahead() {
            let mut missing = Vec::new();
            for &id in ids {
                for (index, chunk) in self.buffers[&id].chunks.iter().enumerate() {
                    window += self.chunk;
                    if window > budget {
                        plan.push((distance, missing));
                        break 'steps;
                    }
                    if !chunk.is_resident() {
                        missing.push((id, index));
                    }
                }
            }
            plan.push((distance, missing));
        }
        let mut started = 0;
        for (distance, mut refs) in plan {
            refs.sort_unstable();
            refs.dedup();
            if refs.is_empty() {
                continue;
            }
            self.bring_in(call, &refs, crate::movement::Purpose::Ahead { horizon: distance })?;
            let landed = refs.iter().filter(|&&r| self.chunk_mut(r).is_resident()).count();
            started += landed * self.chunk;
            if landed < refs.len() {
                break; // No room without evicting something needed sooner.
            }
        }
        Ok(started)
    }

    fn target_refs(&self, call: &'static str, target: Target) -> Result<Vec<ChunkRef>> {
        let ids: Vec<BufferId> = match target {
            Target::Buffer(id) => {
                self.buffer(call, id)?;
                vec![id]
            }
            Target::All => self.buffers.keys().copied().collect(),
        };
        Ok(ids.into_iter().flat_map(|id| (0..self.buffers[&id].chunks.len()).map(move |i| (id, i))).collect())
    }

    fn page_in_start(&mut self, target: Target) -> Result<Ticket> {
        let refs = self.target_refs("page_in", target)?;
        self.check_cap("page_in", refs.len())?;
        self.reap()?;
        let fences = self.bring_in("page_in", &refs, crate::movement::Purpose::Demand)?;
        Ok(self.ticket(fences))
    }

    fn page_out_start(&mut self, target: Target) -> Result<Ticket> {
        let refs = self.outgoing_refs("page_out", target)?;
        self.reap()?;
        let fences = self.send_down_resident("page_out", &refs)?;
        Ok(self.ticket(fences))
    }

    /// The chunks of an outgoing target; refused if any of them is acquired.
    fn outgoing_refs(&self, call: &'static str, target: Target) -> Result<Vec<ChunkRef>> {
        let refs = self.target_refs(call, target)?;
        let pinned: Vec<&ChunkRef> = refs.iter().filter(|r| self.buffers[&r.0].chunks[r.1].pins > 0).collect();
        if let Some(&&(buffer, _)) = pinned.first() {
            let pinned_chunks = pinned.iter().filter(|r| r.0 == buffer).count();
            return Err(Error::Acquired { call, buffer, pinned_chunks });
        }
        Ok(refs)
    }

    /// Sends down those of `refs` that are resident now.
    fn send_down_resident(&mut self, call: &'static str, refs: &[ChunkRef]) -> Result<Vec<Arc<Fence>>> {
        let resident: Vec<ChunkRef> =
            refs.iter().copied().filter(|r| self.buffers[&r.0].chunks[r.1].is_resident()).collect();
        self.send_down(call, &resident)
    }

    fn exchange_start(&mut self, outgoing: Target, incoming: Target) -> Result<Ticket> {
        let call = "exchange";
        let out = self.outgoing_refs(call, outgoing)?;
        let inc = self.target_refs(call, incoming)?;
        if let Some(&(buffer, _)) = inc.iter().find(|r| out.binary_search(r).is_ok()) {
            return Err(Error::Conflict { call, buffer });
        }
        self.check_cap(call, inc.len())?;
        self.reap()?;
        // Mapping waits for copies to the host in flight (on the H200 a batch of 16 chunks took
        // 17 ms instead of 0.35 ms during a 1 GiB copy down), while copies up do not delay it.
        // So the incoming chunks are mapped first, their copies up streaming meanwhile, and only
        // then are the outgoing copies issued: the two directions overlap.
        let mut fences = self.bring_in(call, &inc, crate::movement::Purpose::Demand)?;
        fences.extend(self.send_down_resident(call, &out)?);
        Ok(self.ticket(fences))
    }

    pub(crate) fn ticket(&mut self, fences: Vec<Arc<Fence>>) -> Ticket {
        self.ticket_for(TicketWork { fences, ..TicketWork::default() })
    }

    fn ticket_for(&mut self, work: TicketWork) -> Ticket {
        let id = self.next_ticket;
        self.next_ticket += 1;
        self.tickets.insert(id, work);
        Ticket(id)
    }

    fn page_out_to_file_start(&mut self, target: Target) -> Result<Ticket> {
        let call = "page_out_to_file";
        if self.file.is_none() {
            return Err(Error::Config(format!("{call}: there is no file tier (set TIERMEM_FILE)")));
        }
        let refs = self.outgoing_refs(call, target)?;
        self.reap()?;
        let fences = self.send_down_resident(call, &refs)?;
        let file_write = self.start_file_write(call, &refs)?;
        let ticket = self.ticket_for(TicketWork { fences, then_to_file: refs });
        if let Some(write) = file_write {
            self.writes.insert(ticket.0, write);
        }
        Ok(ticket)
    }

    pub fn describe_tiers(&self) -> String {
        let g = self.chunk;
        let file = self.file.as_ref().map_or(String::new(), |tier| {
            format!(", file {} of {} bytes in use", tier.store.used_slots() * g, tier.store.capacity_slots() * g)
        });
        format!(
            "HBM {} of {} bytes in use ({} acquired), host {} of {} bytes in use{file}",
            self.pool.in_use() * g,
            self.pool.cap() * g,
            self.pinned * g,
            self.host.in_use() * g,
            self.host.cap() * g
        )
    }

    /// Frees every buffer and gives every device resource back.
    fn shutdown(&mut self) -> Result<()> {
        for (_, buffer) in self.buffers.iter_mut() {
            buffer.chunks.iter_mut().for_each(|c| c.pins = 0);
        }
        self.pinned = 0;
        // Background writes read host slots: they end before anything is unpinned.
        self.tickets.clear();
        for write in self.writes.take_running() {
            let (items, outcome) = write.join();
            let _ = self.commit_file_write(items, outcome);
        }
        let ids: Vec<BufferId> = self.buffers.keys().copied().collect();
        let mut first_error = None;
        for id in ids {
            if let Err(e) = self.free(id) {
                first_error.get_or_insert(e);
                self.buffers.remove(&id);
            }
        }
        for stream in [self.streams.up, self.streams.down, self.streams.prefetch] {
            self.device.synchronize_stream(stream).during("shutdown")?;
        }
        self.reap()?;
        while let Some((_, slot)) = self.retiring.pop_front() {
            self.host.free(slot);
        }
        self.timings.clear();
        if let Some(tier) = self.file.as_mut() {
            tier.reader.stop();
        }
        self.pool.release_all(self.device.as_ref()).during("shutdown")?;
        self.host.release_all(self.device.as_ref()).during("shutdown")?;
        for stream in [self.streams.up, self.streams.down, self.streams.prefetch] {
            self.device.destroy_stream(stream).during("shutdown")?;
        }
        first_error.map_or(Ok(()), Err)
    }
}
