//! The simulated device: a test double with the CUDA VMM semantics tiermem relies on, for
//! one GPU or a node of several.
//!
//! "Device memory" is a sparse memfd per GPU of the simulated HBM size, and one more for
//! host-located chunks ([`memory`]); a physical chunk is one granule of its location's memfd.
//! Reserving VA reserves host address space (`PROT_NONE`); mapping a chunk `mmap`s its part
//! of the memfd at the address with no access, and `set_access_from` opens the range for
//! reading and writing and records which GPUs may touch it. So a device pointer is an ordinary
//! host address whose bytes live exactly where the engine put them, and an engine bug — a copy
//! to an unmapped chunk, a mapping over a mapping, a chunk released while mapped, work on a GPU
//! that was not given access to the mapping — is an error here (`Fault`, `Driver`), as it
//! would be an illegal-address fault or an error code on a GPU.
//!
//! The GPUs of a node ([`SimDevice::node`]) share the address space, the chunks, the streams
//! and the events; each has its own HBM capacity (`mem_info` counts the chunks made on it,
//! through whichever GPU). Work runs on the GPU of its stream (the creator; the legacy stream
//! 0 runs work for whoever enqueues it) and may touch only plain allocations of that GPU and
//! mappings with access from it. Access from GPU `g` to a chunk on GPU `k` needs peer access
//! (every pair, or none: [`SimDevice::node_without_peer_access`]); host chunks open to all.
//!
//! Shareable allocations (`create_shareable_chunks_at`) each have a memfd of their own
//! ([`shareable`]): `export_chunk` hands out a duplicate of it and `import_chunk`, in any
//! simulated node of any process, takes one, so the bytes are shared as a GPU shares them
//! between processes. An imported allocation counts against no GPU's capacity here (its maker
//! counts it) and any GPU of the node may be given access to it: its home is not known.
//!
//! Freshly created chunks are filled with a poison byte, because `cuMemCreate` does not
//! zero memory either: an engine that forgot to zero a never-written chunk fails its tests.
//!
//! Copies, memsets and event records are asynchronous, as on a GPU: they run later, in an
//! order the simulated device picks at random among the streams that can proceed (see
//! [`queues`]). A copy that finds its memory unmapped, without access or unpinned when it runs
//! is a sticky `Fault`, reported by every later synchronisation. Timings are meaningless:
//! events report 0 ms. With the `failpoints` feature, each driver-call stand-in has a failpoint
//! of the CUDA call's name (`cuMemCreate`, `cuMemMap`, …) so tests can fail any step.

use crate::{
    BackendKind, ChunkLocation, Device, DeviceError, DeviceInfo, DevicePtr, EventHandle, GpuMemory, HostPtr,
    PhysHandle, Result, StreamHandle, StreamPriority,
};
mod memory;
mod queues;
mod shareable;
mod work;

use crate::faults::RandomFaults;
use memory::Memory;
pub use queues::Timing;
use queues::{Queues, Work};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// The granule of the simulated device: the H200's VMM granularity.
pub const SIM_GRANULARITY: usize = 2 << 20;
/// Byte that fills freshly created chunks, standing in for whatever the GPU left there.
pub const POISON: u8 = 0xDB;

/// Counts of everything the simulated device has handed out and not had back.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SimLive {
    pub reservations: usize,
    pub mapped_chunks: usize,
    pub chunks: usize,
    pub pinned_bytes: usize,
    pub plain_allocations: usize,
    pub streams: usize,
    pub events: usize,
}

impl SimLive {
    pub fn is_empty(&self) -> bool {
        *self == SimLive::default()
    }
}

/// One simulated GPU. GPUs made together by [`SimDevice::node`] share one address space,
/// one set of physical chunks, streams and events; each has its own HBM.
pub struct SimDevice {
    info: DeviceInfo,
    node: Arc<Node>,
}

/// What the GPUs of a simulated node share.
struct Node {
    /// Whether every GPU of the node may access every other one's memory.
    peer_access: bool,
    state: Mutex<SimState>,
}

/// What a synchronisation waits for.
#[derive(Clone, Copy)]
enum Need {
    StreamIdle(u64),
    EventDone(u64),
}

/// One granule of a reservation with a chunk mapped there.
#[derive(Clone, Copy)]
struct Mapping {
    chunk: PhysHandle,
    /// The whole mapping this granule belongs to (start, bytes): `cuMemUnmap` takes whole
    /// mappings only, as CUDA's does.
    whole: (DevicePtr, usize),
    /// Bit `g` set: GPU `g` may touch the mapping (`set_access_from`).
    access: u64,
}

struct SimState {
    reservations: BTreeMap<DevicePtr, usize>,
    /// Granule-aligned VA → what is mapped there.
    mappings: BTreeMap<DevicePtr, Mapping>,
    memory: Memory,
    /// For each mapped chunk, the addresses it is mapped at (CUDA allows several).
    mapped_chunks: HashMap<u64, Vec<DevicePtr>>,
    /// Chunks whose handle was given up while mapped (`release_mapped_chunk`): freed when
    /// their last mapping goes.
    released_mapped: std::collections::HashSet<u64>,
    /// Allocations of several granules (`create_chunks_at`), by handle: the granule chunks
    /// they are made of, mapped and released together.
    groups: HashMap<u64, Vec<PhysHandle>>,
    next_group: u64,
    pinned: BTreeMap<HostPtr, usize>,
    /// Plain allocations: size and the GPU that made them, the only one that may touch them.
    plain: HashMap<DevicePtr, (usize, usize)>,
    queues: Queues,
    /// The GPU that runs the work of each stream (its creator); work on the legacy stream 0
    /// runs on the GPU that enqueued it.
    stream_gpus: HashMap<u64, usize>,
    /// How busy each GPU's own kernels keep it, in percent, as `gpu_memory` reports it
    /// ([`SimDevice::set_busy`]; 0 if never set).
    busy: HashMap<usize, u32>,
    /// The first fault of asynchronous work; sticky, like a CUDA context error.
    fault: Option<String>,
    /// Driver calls that fail at random (`SimDevice::inject_errors`).
    faults: RandomFaults,
    next_handle: u64,
}

macro_rules! failpoint {
    ($self:ident, $name:literal) => {
        fail::fail_point!($name, |_| Err(DeviceError::Driver {
            call: $name,
            code: "CUDA_ERROR_OUT_OF_MEMORY".into(),
            detail: "injected by failpoint".into(),
        }));
        $self.injected($name)?;
    };
}

/// The most GPUs a simulated node has (access is a bit per GPU).
pub const SIM_MAX_GPUS: usize = 64;

impl SimDevice {
    /// A simulated device with `hbm_bytes` of memory (rounded down to whole granules).
    /// Refused if host memory could not hold it: host memory stands in for its HBM.
    pub fn new(hbm_bytes: usize) -> Result<Self> {
        let mut gpus = Self::build(1, hbm_bytes, true)?;
        Ok(gpus.pop().expect("a node of one GPU"))
    }

    /// A simulated node of `gpus` GPUs with `hbm_per_gpu` bytes of HBM each, every one with
    /// peer access to every other; element `i` is GPU `i`. They share one address space and
    /// the physical chunks: a chunk made on GPU 1 can be mapped anywhere and touched by every
    /// GPU given access to it. Streams, events, timing, seeds, injected errors and
    /// [`SimDevice::live`] are the node's, whichever GPU is asked.
    pub fn node(gpus: usize, hbm_per_gpu: usize) -> Result<Vec<Self>> {
        Self::build(gpus, hbm_per_gpu, true)
    }

    /// As [`SimDevice::node`], but no GPU has peer access to another: each may touch only
    /// chunks in its own HBM or in host memory (GPUs on separate PCIe roots).
    pub fn node_without_peer_access(gpus: usize, hbm_per_gpu: usize) -> Result<Vec<Self>> {
        Self::build(gpus, hbm_per_gpu, false)
    }

    fn build(gpus: usize, hbm_per_gpu: usize, peer_access: bool) -> Result<Vec<Self>> {
        if !(1..=SIM_MAX_GPUS).contains(&gpus) {
            return Err(DeviceError::Config(format!("a simulated node of {gpus} GPUs: between 1 and {SIM_MAX_GPUS}")));
        }
        let hbm_bytes = hbm_per_gpu.saturating_mul(gpus);
        if let Some(host) = crate::HostMemory::read().filter(|host| hbm_bytes > host.available) {
            return Err(DeviceError::Config(format!(
                "a simulated device of {:.2} GiB is more than the {:.2} GiB of host memory available, which stands in for its HBM: set TIERMEM_SIM_HBM (or the HBM cap the simulated device is sized from) lower",
                hbm_bytes as f64 / (1u64 << 30) as f64,
                host.available as f64 / (1u64 << 30) as f64
            )));
        }
        let capacity_chunks = hbm_per_gpu / SIM_GRANULARITY;
        let state = SimState {
            reservations: BTreeMap::new(),
            mappings: BTreeMap::new(),
            memory: Memory::new(gpus, capacity_chunks)?,
            mapped_chunks: HashMap::new(),
            released_mapped: std::collections::HashSet::new(),
            groups: HashMap::new(),
            next_group: 0,
            pinned: BTreeMap::new(),
            plain: HashMap::new(),
            queues: Queues::new(0x5eed_cafe ^ hbm_per_gpu as u64 ^ ((gpus as u64 - 1) << 56)),
            stream_gpus: HashMap::new(),
            busy: HashMap::new(),
            fault: None,
            faults: RandomFaults::default(),
            next_handle: 0,
        };
        let node = Arc::new(Node { peer_access, state: Mutex::new(state) });
        let device = |ordinal: usize| SimDevice {
            info: DeviceInfo {
                backend: BackendKind::Sim,
                ordinal,
                name: "tiermem simulated device".into(),
                device_count: gpus,
                driver_version: "none (simulated)".into(),
                cuda_version: "none (simulated)".into(),
                total_bytes: capacity_chunks * SIM_GRANULARITY,
                granularity: SIM_GRANULARITY,
                vmm_supported: true,
                peers: if peer_access { (0..gpus).filter(|&g| g != ordinal).collect() } else { Vec::new() },
                uuid: None,
            },
            node: Arc::clone(&node),
        };
        Ok((0..gpus).map(device).collect())
    }

    /// GPU `ordinal` of this one's node (which has it).
    pub(crate) fn sibling(&self, ordinal: usize) -> SimDevice {
        let mut info = self.info.clone();
        let gpus = info.device_count;
        info.peers = match self.node.peer_access {
            true => (0..gpus).filter(|&g| g != ordinal).collect(),
            false => Vec::new(),
        };
        info.ordinal = ordinal;
        SimDevice { info, node: Arc::clone(&self.node) }
    }

    /// When queued work runs besides when it is waited for ([`Timing`]; `Eager` by default),
    /// on every GPU of the node. `Lazy` is the slowest GPU allowed, for tests that must see a
    /// missing wait every time.
    pub fn set_timing(&self, timing: Timing) {
        self.lock().queues.set_timing(timing);
    }

    /// GPU `ordinal` of the node reports its kernels running `percent` of the time from now on
    /// (`GpuMemory::busy_percent`), as a GPU running a program of its own would.
    pub fn set_busy(&self, ordinal: usize, percent: u32) {
        self.lock().busy.insert(ordinal, percent);
    }

    /// Makes about one in `one_in` of the driver calls that can fail on a GPU (those with a
    /// failpoint: create, map, set access, unmap, pin, the asynchronous copies, reserve) fail
    /// with an injected `CUDA_ERROR_UNKNOWN`, chosen by a generator seeded with `seed`; `None`
    /// stops it. Per device (per node: its GPUs share the generator), so tests running in
    /// parallel do not disturb each other.
    pub fn inject_errors(&self, one_in: Option<u64>, seed: u64) {
        self.lock().faults = RandomFaults::new(one_in, seed);
    }

    pub fn injecting_errors(&self) -> bool {
        self.lock().faults.active()
    }

    /// An injected failure of `call`, if this call is one of the unlucky ones.
    fn injected(&self, call: &'static str) -> Result<()> {
        if !self.lock().faults.fires() {
            return Ok(());
        }
        Err(DeviceError::Driver {
            call,
            code: "CUDA_ERROR_UNKNOWN".into(),
            detail: "injected at random (SimDevice::inject_errors)".into(),
        })
    }

    /// Seeds the random choices of when and in which order queued work runs: the same calls
    /// with the same seed run the same schedule.
    pub fn set_seed(&self, seed: u64) {
        self.lock().queues.set_seed(seed);
    }

    /// What is still allocated on the whole node (chunks of every location included); all
    /// zero once every user has cleaned up.
    pub fn live(&self) -> SimLive {
        let s = self.lock();
        let (streams, events) = s.queues.live();
        SimLive {
            reservations: s.reservations.len(),
            mapped_chunks: s.mappings.len(),
            chunks: s.memory.live(),
            pinned_bytes: s.pinned.values().sum(),
            plain_allocations: s.plain.len(),
            streams,
            events,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SimState> {
        self.node.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn gran(&self) -> usize {
        SIM_GRANULARITY
    }

    fn invalid(call: &'static str, detail: String) -> DeviceError {
        DeviceError::Driver { call, code: "CUDA_ERROR_INVALID_VALUE".into(), detail }
    }

    fn check_aligned(&self, call: &'static str, va: DevicePtr, size: usize) -> Result<()> {
        let g = self.gran() as u64;
        if !va.is_multiple_of(g) || size == 0 || !(size as u64).is_multiple_of(g) {
            return Err(Self::invalid(call, format!("va=0x{va:x} size={size} not granule-aligned")));
        }
        Ok(())
    }

    /// Whether `[ptr, ptr+len)` is device memory GPU `gpu` may touch now: its own plain
    /// allocation, or granules mapped with access from it.
    fn device_range_ok(s: &SimState, gpu: usize, ptr: DevicePtr, len: usize) -> bool {
        if let Some((&base, &(size, owner))) = s.plain.iter().find(|(&b, &(sz, _))| ptr >= b && ptr < b + sz as u64) {
            return owner == gpu && ptr + len as u64 <= base + size as u64;
        }
        let g = SIM_GRANULARITY as u64;
        let (first, end) = (ptr - ptr % g, ptr + len as u64);
        (first..end).step_by(g as usize).all(|va| s.mappings.get(&va).is_some_and(|m| m.access & 1 << gpu != 0))
    }

    fn pinned_range_ok(s: &SimState, ptr: HostPtr, len: usize) -> bool {
        s.pinned.range(..=ptr).next_back().is_some_and(|(&base, &size)| ptr + len <= base + size)
    }

    fn check_device(s: &SimState, call: &'static str, gpu: usize, ptr: DevicePtr, len: usize) -> Result<()> {
        if len == 0 || Self::device_range_ok(s, gpu, ptr, len) {
            Ok(())
        } else {
            Err(DeviceError::Fault(format!(
                "{call}: device range 0x{ptr:x}+{len} is not mapped with access from GPU {gpu}"
            )))
        }
    }

    fn check_pinned(s: &SimState, call: &'static str, ptr: HostPtr, len: usize) -> Result<()> {
        if len == 0 || Self::pinned_range_ok(s, ptr, len) {
            Ok(())
        } else {
            Err(DeviceError::Fault(format!("{call}: host range 0x{ptr:x}+{len} is not pinned memory")))
        }
    }

    /// The GPU that runs work enqueued on `stream` through this device.
    fn gpu_of(&self, s: &SimState, stream: u64) -> usize {
        s.stream_gpus.get(&stream).copied().unwrap_or(self.info.ordinal)
    }

    /// Whether GPU `gpu` may be given access to memory at `location`.
    fn can_reach(&self, gpu: usize, location: ChunkLocation) -> bool {
        match location {
            ChunkLocation::Host => true,
            ChunkLocation::Gpu(home) => home == gpu || self.node.peer_access,
        }
    }

    /// Locks the state and lets the device make a little progress, as time passing would.
    fn lock_progressing(&self) -> std::sync::MutexGuard<'_, SimState> {
        let mut s = self.lock();
        for _ in 0..s.queues.background_steps() {
            Self::run_one(&mut s, None);
        }
        s
    }

    /// Runs the head of `stream` (or of any stream) if it can run; false if none could.
    fn run_one(s: &mut SimState, stream: Option<u64>) -> bool {
        match s.queues.pop(stream) {
            None => false,
            Some(None) => true,
            Some(Some(work)) => {
                work::perform(s, work);
                true
            }
        }
    }

    /// The sticky fault of asynchronous work, if any.
    fn check_fault(s: &SimState) -> Result<()> {
        match &s.fault {
            Some(f) => Err(DeviceError::Fault(f.clone())),
            None => Ok(()),
        }
    }

    /// Runs work until `need` is met, running only what it needs (the queues' `blocker`
    /// chain); an error if that can never happen.
    fn run_until(s: &mut SimState, call: &'static str, need: Need) -> Result<()> {
        loop {
            let next = match need {
                Need::StreamIdle(id) if s.queues.stream_idle(id) => break,
                Need::EventDone(e) if s.queues.event_done(e) => break,
                Need::StreamIdle(id) => s.queues.blocker(id),
                Need::EventDone(e) => s.queues.event_blocker(e),
            };
            if !next.is_some_and(|stream| Self::run_one(s, Some(stream))) {
                return Err(DeviceError::Driver {
                    call,
                    code: "CUDA_ERROR_LAUNCH_TIMEOUT".into(),
                    detail: "deadlock: waiting on work that can never run".into(),
                });
            }
        }
        Self::check_fault(s)
    }

    fn stream_of(s: &SimState, call: &'static str, stream: StreamHandle) -> Result<u64> {
        if s.queues.has_stream(stream.0) {
            Ok(stream.0)
        } else {
            Err(Self::invalid(call, format!("stream {} is not live", stream.0)))
        }
    }

    fn event_of(s: &SimState, call: &'static str, event: EventHandle) -> Result<u64> {
        if s.queues.has_event(event.0) {
            Ok(event.0)
        } else {
            Err(Self::invalid(call, format!("event {} is not live", event.0)))
        }
    }

    fn new_handle(s: &mut SimState) -> u64 {
        s.next_handle += 1;
        s.next_handle
    }
}

impl Drop for SimState {
    fn drop(&mut self) {
        for (&va, &size) in &self.reservations {
            // SAFETY: the range was mapped by `reserve` and nothing else refers to it now.
            unsafe { libc::munmap(va as *mut libc::c_void, size) };
        }
        let host = self.pinned.iter().map(|(&p, &n)| (p, n));
        for (ptr, size) in host.chain(self.plain.iter().map(|(&p, &(n, _))| (p as usize, n))) {
            // SAFETY: these are our own anonymous mappings, unreachable once the node is gone.
            unsafe { libc::munmap(ptr as *mut libc::c_void, size) };
        }
    }
}

// The `Device` calls themselves (after `failpoint!`, which they use).
mod driver;
