//! The process-wide state of the interposition: each GPU tiermem manages (its device, chunk
//! size, budget and HBM in use), the books of allocations, and the statistics.
//!
//! An allocation reserves VA for the request rounded up to the driver's granularity (2 MiB),
//! cuts it into chunks of [`chunk_size`] bytes (the last one shorter), creates each chunk as
//! one physical allocation where [`placement::place`] says (HBM while the budget allows, else
//! host memory; HBM that the driver reports full sends the rest to the host too), maps them in
//! order and sets access for the GPU once over the whole range. Any failure undoes every step
//! taken.
//!
//! A chunk is the unit that migrates (migrate.rs), and its size is a trade. The VMM calls of a
//! move cost per *mapping*, not per byte: on the H200, remapping a 2 MiB chunk (unmap, map,
//! access) took 70-100 µs, more than copying it (40 µs), while a 32 MiB one took 140-450 µs,
//! 9-28 µs per 2 MiB (`scripts/gpu/probes/vmm_parallel.py`; driver calls from several threads
//! did not go faster). Larger chunks follow hotness more coarsely. 32 MiB by default
//! (`TIERMEM_CHUNK`). A free takes the
//! allocation out of the books first (so a second free of it is the driver's business), waits
//! for the work that may still use it, then unmaps, releases and unreserves.
//!
//! Locking: one mutex over [`Process`]. An allocation holds it across its driver calls (they
//! do not wait for the GPU); a free waits for the GPU with it released. A GPU is opened (the
//! mechanism's `CudaDevice::open`, which retains its primary context) at its first allocation
//! or memory query; a GPU that cannot be opened is left to the driver, unmanaged.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tiermem_mechanism::cuda::CudaDevice;
use tiermem_mechanism::{ChunkLocation, Device, DeviceError};

use crate::allocations::{Allocation, Allocations};
use crate::boundary::{log, CuResult, CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_UNKNOWN, CUDA_SUCCESS};
use crate::driver::{driver, Stream};
use crate::hotness;
use crate::placement::{self, Placement, Tier};
use crate::shadows::{self, Shadows};
use crate::stats::Stats;

/// Bytes of a chunk unless `TIERMEM_CHUNK` says otherwise (module documentation).
const DEFAULT_CHUNK: usize = 32 << 20;

/// One GPU as tiermem manages it; `device` is `None` for a GPU left to the driver.
pub struct Gpu {
    pub device: Option<Arc<dyn Device>>,
    /// The driver's granularity: reservations and physical allocations are multiples of it.
    pub granularity: usize,
    /// Bytes of a chunk (the last of an allocation is shorter).
    pub chunk: usize,
    /// The HBM its allocations may hold: `limit`, or less where the node daemon grants less.
    pub budget: usize,
    /// The budget standing alone: `TIERMEM_HBM_LIMIT` (a size or share), or free memory less a reserve.
    pub limit: usize,
    pub hbm_used: usize,
}

impl Gpu {
    /// Whole chunks the budget has room for beyond the HBM in use; negative: chunks over it (a
    /// budget the node daemon lowered), which the next moves send down first (moves.rs).
    pub fn room_chunks(&self) -> isize {
        let chunk = self.chunk.max(1);
        match self.budget.checked_sub(self.hbm_used) {
            Some(room) => (room / chunk) as isize,
            None => -((self.hbm_used - self.budget).div_ceil(chunk) as isize),
        }
    }
}

/// The process-wide state (module documentation); migrate.rs moves chunks under its lock.
pub struct Process {
    pub gpus: BTreeMap<usize, Gpu>,
    pub books: Allocations,
    /// The second mappings moves copy into (shadows.rs), by physical chunk.
    pub shadows: Shadows,
    pub stats: Stats,
    /// Whether the missing host chunks were reported already.
    said_no_host_chunks: bool,
}

static PROCESS: Mutex<Process> = Mutex::new(Process {
    gpus: BTreeMap::new(),
    books: Allocations::new(),
    shadows: Shadows::new(),
    stats: Stats::new(),
    said_no_host_chunks: false,
});

/// The process state, locked.
pub fn lock() -> MutexGuard<'static, Process> {
    process()
}

fn process() -> MutexGuard<'static, Process> {
    // Every change under the lock is a few map and counter updates: consistent after a panic.
    PROCESS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What waits for the GPU before a free unmaps: the whole context (`cuMemFree`), or the
/// stream the free was ordered on (`cuMemFreeAsync`).
#[derive(Debug, Clone, Copy)]
pub enum Drain {
    Context,
    Stream(Stream),
}

/// The ordinal of the GPU of the calling thread's current context, or the driver's error
/// (no context: `CUDA_ERROR_INVALID_CONTEXT`). `None`: the driver cannot say; leave the call to it.
pub fn current_gpu() -> Option<Result<usize, CuResult>> {
    let get_device = driver()?.ctx_get_device?;
    let mut device = 0;
    // SAFETY: valid out-pointer; the driver's cuCtxGetDevice.
    match unsafe { get_device(&mut device) } {
        // The driver's device handles are the ordinals (cuDeviceGet(&d, i) gives d == i).
        CUDA_SUCCESS => Some(usize::try_from(device).map_err(|_| CUDA_ERROR_UNKNOWN)),
        code => Some(Err(code)),
    }
}

impl Process {
    /// GPU `ordinal`, opened at its first use; a second GPU opened makes each GPU's allocations
    /// reachable from the other where the hardware allows (peers.rs).
    pub fn gpu(&mut self, call: &str, ordinal: usize) -> &mut Gpu {
        if !self.gpus.contains_key(&ordinal) {
            let gpu = self.open(call, ordinal);
            let opened = gpu.device.clone();
            self.gpus.insert(ordinal, gpu);
            if let Some(device) = opened {
                crate::peers::opened(self, call, ordinal, device.as_ref());
                crate::spill::opened(call, ordinal, device.as_ref());
            }
        }
        self.gpus.get_mut(&ordinal).expect("inserted above")
    }

    /// Puts the freed allocation kept mapped at `va` (deferred.rs) back in the books for a new
    /// request of `requested` bytes; `None` if none is kept there. Its HBM was never given back,
    /// so the budget is as it was; its chunks are where the moves since its free left them.
    fn rebook(&mut self, va: u64, requested: usize) -> Option<u64> {
        let mut allocation = self.books.take_kept(va)?;
        let gpus = crate::peers::access_gpus(allocation.ordinal);
        let device = self.gpus.get(&allocation.ordinal).and_then(|gpu| gpu.device.clone());
        if let Some(device) = device.filter(|_| gpus.len() > 1) {
            // A GPU opened since it was freed reaches it too (peers.rs); a failure leaves it to
            // its own GPU, as before.
            let _ = device.set_access_from(allocation.va, allocation.reserved, &gpus);
        }
        allocation.requested = requested;
        let end = allocation.va + allocation.reserved as u64;
        let on_host = allocation.chunks.iter().map(|&(_, tier)| tier == Tier::Host).collect();
        hotness::insert(va, end, allocation.chunk, on_host);
        self.stats.allocated(allocation.bytes_on(Tier::Hbm), allocation.bytes_on(Tier::Host));
        self.books.insert(allocation);
        Some(va)
    }

    /// Gives `bytes` of HBM back to GPU `ordinal`'s budget.
    fn give_back_hbm(&mut self, ordinal: usize, bytes: usize) {
        if let Some(gpu) = self.gpus.get_mut(&ordinal) {
            gpu.hbm_used = gpu.hbm_used.saturating_sub(bytes);
        }
    }

    /// GPU `ordinal` opened (the mechanism's device, which retains its primary context), or
    /// left to the driver if it cannot be.
    fn open(&mut self, call: &str, ordinal: usize) -> Gpu {
        let opened = CudaDevice::open(ordinal).and_then(|device| {
            let (free, total) = device.mem_info()?;
            Ok((device.info().granularity, (free, total), device))
        });
        match opened {
            Ok((granularity, (free, total), device)) => {
                let chunk = chunk_size(granularity);
                let device = Some(Arc::new(device) as Arc<dyn Device>);
                if let Some(kept) = crate::reset::kept_through_reset(ordinal) {
                    let crate::reset::Kept { budget, limit, hbm_used } = kept;
                    return Gpu { device, granularity, chunk, budget, limit, hbm_used };
                }
                let limit = crate::lease::standalone_budget(call, free, total);
                Gpu { device, granularity, chunk, budget: limit, limit, hbm_used: 0 }
            }
            Err(why) => {
                log(
                    call,
                    &format!("GPU {ordinal} could not be opened ({why})"),
                    "its allocations go to the driver unmanaged, without a budget",
                );
                Gpu { device: None, granularity: 0, chunk: 0, budget: 0, limit: 0, hbm_used: 0 }
            }
        }
    }
}

/// Bytes of a chunk on a GPU of `granularity`: `TIERMEM_CHUNK` (a size, `32MiB` by default;
/// module documentation) rounded up to a whole number of granules.
pub fn chunk_size(granularity: usize) -> usize {
    static CHUNK: OnceLock<usize> = OnceLock::new();
    let wanted = *CHUNK.get_or_init(|| match std::env::var("TIERMEM_CHUNK") {
        Err(_) => DEFAULT_CHUNK,
        Ok(text) => tiermem::parse_size(&text).unwrap_or_else(|why| {
            log("TIERMEM_CHUNK", &why.to_string(), "using 32MiB");
            DEFAULT_CHUNK
        }),
    });
    let granularity = granularity.max(1);
    wanted.max(1).next_multiple_of(granularity)
}

/// How an allocation is served.
pub enum Served {
    /// By tiermem, always mapped: the pointer.
    Tiermem(u64),
    /// By the driver, unmanaged (a GPU tiermem does not manage).
    Driver,
    /// By the driver, counted against GPU `ordinal`'s budget (a small one, placement.rs): the
    /// caller makes it, then calls [`driver_allocated`] with the outcome.
    DriverCounted { ordinal: usize, bytes: usize },
}

/// Allocates `size` (> 0) bytes on the current GPU, always mapped, or says who else serves it;
/// `stream`: the stream an asynchronous allocation is ordered on.
pub fn alloc(call: &str, size: usize, stream: Option<Stream>) -> Result<Served, CuResult> {
    let ordinal = match current_gpu() {
        None => return Ok(Served::Driver),
        Some(current) => current?,
    };
    crate::lease::ensure(call, ordinal);
    let mut p = process();
    let gpu = p.gpu(call, ordinal);
    let Some(device) = gpu.device.clone() else { return Ok(Served::Driver) };
    let (granularity, chunk, mut budget, mut hbm_used) = (gpu.granularity, gpu.chunk, gpu.budget, gpu.hbm_used);
    if placement::small_to_driver(size, granularity, budget, hbm_used) {
        // Counted now, before the driver is asked, so that threads allocating at once never
        // overrun the budget together; given back if the driver refuses.
        let bytes = placement::small_footprint(size);
        gpu.hbm_used += bytes;
        return Ok(Served::DriverCounted { ordinal, bytes });
    }
    let Some(reserved) = size.checked_next_multiple_of(granularity) else {
        p.stats.refused += 1;
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    };
    // A freed allocation of this size kept mapped (deferred.rs) serves it, already counted.
    if let Some(va) = crate::deferred::reuse(ordinal, reserved, stream).and_then(|va| p.rebook(va, size)) {
        crate::deferred::served((ordinal, reserved), va);
        return Ok(Served::Tiermem(va));
    }
    if hbm_used + reserved > budget && crate::deferred::any() {
        // Memory freed in stream order is the budget's again before anything spills.
        drop(p);
        crate::deferred::make_room(call, ordinal, hbm_used + reserved - budget);
        p = process();
        let gpu = p.gpu(call, ordinal);
        (budget, hbm_used) = (gpu.budget, gpu.hbm_used);
    }
    let placement = placement::place(reserved, chunk, budget, hbm_used);
    let shape = Allocation { va: 0, reserved, requested: size, ordinal, chunk, chunks: Vec::new(), shared: false };
    match build(device.as_ref(), shape, placement) {
        Ok(allocation) => {
            let (hbm, host) = (allocation.bytes_on(Tier::Hbm), allocation.bytes_on(Tier::Host));
            p.gpu(call, ordinal).hbm_used += hbm;
            p.stats.allocated(hbm, host);
            let va = allocation.va;
            let on_host = allocation.chunks.iter().map(|&(_, tier)| tier == Tier::Host).collect();
            hotness::insert(va, va + reserved as u64, chunk, on_host);
            p.books.insert(allocation);
            crate::deferred::served((ordinal, reserved), va);
            crate::trace::event("allocated", || format!("\"va\": {va}, \"bytes\": {reserved}, \"host\": {host}"));
            Ok(Served::Tiermem(va))
        }
        Err(why) => {
            p.stats.refused += 1;
            match why {
                // What the driver says when memory runs out: HBM and host both full.
                DeviceError::OutOfMemory { .. } => {}
                DeviceError::Driver { ref code, .. } if code == "CUDA_ERROR_OUT_OF_MEMORY" => {}
                // Said once: a program that frees and retries would repeat it for every attempt.
                DeviceError::Unsupported(why) if !p.said_no_host_chunks => {
                    p.said_no_host_chunks = true;
                    log(
                        call,
                        &format!("{size} B do not fit in the budget and {why}"),
                        "answering CUDA_ERROR_OUT_OF_MEMORY (said once); raise --hbm-limit",
                    )
                }
                DeviceError::Unsupported(_) => {}
                other => {
                    log(call, &format!("{size} B could not be mapped ({other})"), "answering CUDA_ERROR_OUT_OF_MEMORY")
                }
            }
            Err(CUDA_ERROR_OUT_OF_MEMORY)
        }
    }
}

/// Reserves, creates, maps and opens to its GPU an allocation of `shape.reserved` bytes cut
/// into chunks of `shape.chunk`, placed as `placement`; on failure undoes every step and
/// returns the first error.
fn build(device: &dyn Device, shape: Allocation, placement: Placement) -> Result<Allocation, DeviceError> {
    let count = placement.hbm + placement.host;
    let va = device.reserve(shape.reserved)?;
    let mut allocation = Allocation { va, chunks: Vec::with_capacity(count), ..shape };
    let granularity = device.info().granularity.max(1);
    let ordinal = allocation.ordinal;
    let mut mapped = 0;
    let mut made = |allocation: &mut Allocation| -> Result<(), DeviceError> {
        let mut gpu_full = false;
        for index in 0..count {
            let len = allocation.chunk_len(index);
            let beyond = || crate::spill::create_beyond(device, ordinal, len);
            let tier = if gpu_full { Tier::Host } else { placement.tier(index) };
            let created = match tier {
                Tier::Hbm => crate::ipc::create_chunk(device, ChunkLocation::Gpu(ordinal), len / granularity),
                Tier::Host => beyond(),
            };
            let (handle, tier) = match created {
                Ok(handle) => (handle, tier),
                // Other programs hold the HBM the budget counted on: beyond it takes the rest.
                Err(DeviceError::OutOfMemory { .. }) if tier == Tier::Hbm => {
                    gpu_full = true;
                    (beyond()?, Tier::Host)
                }
                Err(other) => return Err(other),
            };
            allocation.chunks.push((handle, tier));
            device.map_sized(allocation.chunk_va(index), handle, len)?;
            mapped += 1;
        }
        device.set_access_from(va, allocation.reserved, &crate::peers::access_gpus(ordinal))
    };
    match made(&mut allocation) {
        Ok(()) => Ok(allocation),
        Err(first) => {
            for index in 0..mapped {
                let _ = device.unmap(allocation.chunk_va(index), allocation.chunk_len(index));
            }
            for &(handle, _) in &allocation.chunks {
                let _ = crate::spill::release(device, handle);
            }
            let _ = device.unreserve(va, allocation.reserved);
            Err(first)
        }
    }
}

/// An allocation taken out of the books by a free, to be torn down once the GPU is done with it
/// ([`teardown`]), or kept mapped in the books for a reuse until then ([`keep`], deferred.rs).
pub struct Freed {
    allocation: Allocation,
    device: Arc<dyn Device>,
}

impl Freed {
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    /// Its start.
    pub fn va(&self) -> u64 {
        self.allocation.va
    }

    /// Its GPU and bytes reserved, which a reuse must match (deferred.rs); `None` for a shared
    /// allocation (ipc.rs), never reused: another process may still map its chunks.
    pub fn reusable_as(&self) -> Option<(usize, usize)> {
        (!self.allocation.shared).then_some(self.shape())
    }

    /// Its GPU and the bytes it reserves.
    pub fn shape(&self) -> (usize, usize) {
        (self.allocation.ordinal, self.allocation.reserved)
    }

    /// Bytes of it in HBM.
    pub fn hbm_bytes(&self) -> usize {
        self.allocation.bytes_on(Tier::Hbm)
    }
}

/// Frees the allocation starting at `ptr` once `drain` is done: a context drain waits for it,
/// a stream drain orders it on the stream and returns (deferred.rs). `None`: not an allocation
/// of tiermem's (never made, freed already, or the driver's own): the caller passes the call on.
pub fn free(call: &str, ptr: u64, drain: Drain) -> Option<CuResult> {
    let freed = {
        let mut p = process();
        let allocation = p.books.remove(ptr)?;
        // Freed as the program sees it (statistics); its HBM is the budget's once torn down.
        p.stats.freed(allocation.bytes_on(Tier::Hbm), allocation.bytes_on(Tier::Host));
        crate::ipc::forget(ptr);
        let device = p.gpus.get(&allocation.ordinal).and_then(|gpu| gpu.device.clone());
        device.map(|device| Freed { allocation, device })
    };
    let Some(freed) = freed else {
        log(call, &format!("the GPU of 0x{ptr:x} is gone from tiermem's books"), "please report it");
        return Some(CUDA_ERROR_UNKNOWN);
    };
    let freed = match drain {
        Drain::Stream(stream) => match crate::deferred::defer(freed, stream) {
            Ok(()) => return Some(CUDA_SUCCESS),
            Err(freed) => freed,
        },
        Drain::Context => freed,
    };
    let drained = drain_for(drain);
    Some(teardown(call, freed).map_or_else(|code| code, |()| drained))
}

/// The bytes asked for by tiermem's allocation starting at `ptr`, if it is one.
pub fn allocation_bytes(ptr: u64) -> Option<usize> {
    process().books.containing(ptr).filter(|a| a.va == ptr).map(|a| a.requested)
}

/// Keeps `freed` mapped in the books (deferred.rs): its chunks stay in the hotness index and
/// may move with the cycle's plan (cycle.rs) until it is reused ([`Process::rebook`]) or given
/// back ([`unkeep`]).
pub fn keep(freed: Freed) {
    process().books.keep(freed.allocation);
}

/// The bytes in HBM of each kept allocation, by start: where the moves left its chunks.
pub fn kept_hbm() -> BTreeMap<u64, usize> {
    process().books.kept().map(|a| (a.va, a.bytes_on(Tier::Hbm))).collect()
}

/// The kept allocation at `va` taken out of the books, to be torn down.
pub fn unkeep(va: u64) -> Option<Freed> {
    let mut p = process();
    let allocation = p.books.take_kept(va)?;
    let device = p.gpus.get(&allocation.ordinal).and_then(|gpu| gpu.device.clone())?;
    Some(Freed { allocation, device })
}

/// Unmaps, releases and unreserves a freed allocation (its chunks' shadows first), and gives
/// its HBM back to the budget; `Err` with the code to answer if the driver refused (its memory
/// then stays held).
pub fn teardown(call: &str, freed: Freed) -> Result<(), CuResult> {
    let Freed { allocation, device } = freed;
    // Out of the index before the address is unreserved: a new allocation may get it at once.
    hotness::remove(allocation.va);
    let shadows = process().shadows.take(allocation.chunks.iter().map(|&(handle, _)| handle));
    shadows::undo(device.as_ref(), &shadows);
    // One unmap per chunk mapping: the driver wants each call to cover whole mappings, and
    // has been seen to answer success for a call over several without unmapping them all
    // (crates/mechanism/src/cuda/mod.rs).
    let torn_down = (0..allocation.chunks.len())
        .try_for_each(|index| device.unmap(allocation.chunk_va(index), allocation.chunk_len(index)))
        .and_then(|()| {
            allocation.chunks.iter().try_for_each(|&(handle, _)| crate::spill::release(device.as_ref(), handle))
        })
        .and_then(|()| device.unreserve(allocation.va, allocation.reserved));
    let mut p = process();
    p.give_back_hbm(allocation.ordinal, allocation.bytes_on(Tier::Hbm));
    drop(p);
    crate::migrate::release_if_idle(allocation.ordinal);
    torn_down.map_err(|why| {
        let ptr = allocation.va;
        log(call, &format!("0x{ptr:x} could not be unmapped ({why})"), "its memory stays held until the process exits");
        CUDA_ERROR_UNKNOWN
    })
}

/// Waits for the work that may use memory about to be freed; the driver's answer.
fn drain_for(drain: Drain) -> CuResult {
    let Some(driver) = driver() else { return CUDA_SUCCESS };
    match drain {
        // SAFETY: the driver's cuCtxSynchronize, on the calling thread's current context.
        Drain::Context => driver.ctx_synchronize.map_or(CUDA_SUCCESS, |sync| unsafe { sync() }),
        // SAFETY: the driver's cuStreamSynchronize on the program's own stream handle.
        Drain::Stream(stream) => driver.stream_synchronize.map_or(CUDA_SUCCESS, |sync| unsafe { sync(stream) }),
    }
}

/// `(free, total)` as the current GPU's budget sees them, or `None`: leave it to the driver.
pub fn mem_info(call: &str) -> Option<Result<(usize, usize), CuResult>> {
    let ordinal = match current_gpu()? {
        Ok(ordinal) => ordinal,
        Err(code) => return Some(Err(code)),
    };
    crate::lease::ensure(call, ordinal);
    let mut p = process();
    let gpu = p.gpu(call, ordinal);
    gpu.device.as_ref()?;
    Some(Ok((gpu.budget.saturating_sub(gpu.hbm_used), gpu.budget)))
}

/// The driver made (`Some(ptr)`) or refused the small allocation [`alloc`] counted.
pub fn driver_allocated(ordinal: usize, bytes: usize, made: Option<u64>) {
    let mut p = process();
    match made {
        Some(ptr) => {
            p.books.insert_small(ptr, ordinal, bytes);
            p.stats.allocated(bytes, 0);
        }
        None => {
            p.give_back_hbm(ordinal, bytes);
        }
    }
}

/// Counts a managed allocation the driver made.
pub fn managed_allocated(ptr: u64, size: usize) {
    let mut p = process();
    p.books.insert_managed(ptr, size);
    p.stats.managed_allocated(size);
}

/// A driver allocation tiermem counts (managed, or small: placement.rs), taken out of the books
/// before the driver frees it.
pub struct Taken {
    ptr: u64,
    managed: Option<usize>,
    small: Option<(usize, usize)>,
}

/// Takes the counted driver allocation at `ptr`, if any, out of the books: the address is
/// the driver's to reuse as soon as it frees it, and an allocation of another thread may then
/// be booked under it.
pub fn take_driver_allocation(ptr: u64) -> Taken {
    let mut p = process();
    Taken { ptr, managed: p.books.remove_managed(ptr), small: p.books.remove_small(ptr) }
}

/// The driver freed `taken` (it is no longer counted), or refused to (it goes back in the books).
pub fn driver_free_done(taken: Taken, freed: bool) {
    let mut p = process();
    if !freed {
        if let Some(size) = taken.managed {
            p.books.insert_managed(taken.ptr, size);
        }
        if let Some((ordinal, bytes)) = taken.small {
            p.books.insert_small(taken.ptr, ordinal, bytes);
        }
        return;
    }
    if let Some(size) = taken.managed {
        p.stats.managed_freed(size);
    }
    if let Some((ordinal, bytes)) = taken.small {
        p.give_back_hbm(ordinal, bytes);
        p.stats.freed(bytes, 0);
    }
}

/// Where the program's own VMM chunk of `bytes` in GPU `ordinal`'s HBM goes (vmm.rs): HBM,
/// counted against the budget now, while it fits, else the host; `None`: a GPU tiermem does
/// not manage.
pub fn place_program_chunk(call: &str, ordinal: usize, bytes: usize) -> Option<Tier> {
    crate::lease::ensure(call, ordinal);
    let mut p = process();
    let gpu = p.gpu(call, ordinal);
    gpu.device.as_ref()?;
    if gpu.hbm_used.saturating_add(bytes) <= gpu.budget {
        gpu.hbm_used += bytes;
        return Some(Tier::Hbm);
    }
    Some(Tier::Host)
}

/// Counts `bytes` more of HBM on GPU `ordinal` (a chunk of the program's made there anyway).
pub fn count_hbm(ordinal: usize, bytes: usize) {
    if let Some(gpu) = process().gpus.get_mut(&ordinal) {
        gpu.hbm_used += bytes;
    }
}

/// Gives `bytes` of HBM back to GPU `ordinal`'s budget (a chunk of the program's released).
pub fn uncount_hbm(ordinal: usize, bytes: usize) {
    process().give_back_hbm(ordinal, bytes);
}

/// The GPUs tiermem manages in this process (opened, with a budget).
pub fn managed_gpus() -> Vec<usize> {
    process().gpus.iter().filter(|(_, gpu)| gpu.device.is_some()).map(|(&ordinal, _)| ordinal).collect()
}

/// GPU `ordinal`'s budget and the HBM tiermem holds on it, if tiermem manages it.
pub fn budget_and_use(ordinal: usize) -> Option<(usize, usize)> {
    let p = process();
    let gpu = p.gpus.get(&ordinal).filter(|gpu| gpu.device.is_some())?;
    Some((gpu.budget, gpu.hbm_used))
}

/// The statistics so far.
pub fn stats() -> Stats {
    process().stats
}
