//! The simulated device: a test double with the CUDA VMM semantics tiermem relies on.
//!
//! "Device memory" is one sparse memfd of the simulated HBM size; a physical chunk is one
//! granule of it. Reserving VA reserves host address space (`PROT_NONE`); mapping a chunk
//! `mmap`s its part of the memfd at the address with no access, and `set_access` opens the
//! range for reading and writing. So a device pointer is an ordinary host address whose
//! bytes live exactly where the engine put them, and an engine bug — a copy to an unmapped
//! chunk, a mapping over a mapping, a chunk released while mapped — is an error here
//! (`Fault`, `Driver`), as it would be an illegal-address fault or an error code on a GPU.
//!
//! Freshly created chunks are filled with a poison byte, because `cuMemCreate` does not
//! zero memory either: an engine that forgot to zero a never-written chunk fails its tests.
//!
//! Copies, memsets and event records are asynchronous, as on a GPU: they run later, in an
//! order the simulated device picks at random among the streams that can proceed (see
//! [`queues`]). A copy that finds its memory unmapped or unpinned when it runs is a sticky
//! `Fault`, reported by every later synchronisation. Timings are meaningless: events report 0 ms.
//! With the `failpoints` feature, each driver-call stand-in has a failpoint of the CUDA
//! call's name (`cuMemCreate`, `cuMemMap`, …) so tests can fail any step.

use crate::{
    BackendKind, Device, DeviceError, DeviceInfo, DevicePtr, EventHandle, HostPtr, PhysHandle, Result, StreamHandle,
    StreamPriority,
};
mod queues;
mod work;

use crate::faults::RandomFaults;
pub use queues::Timing;
use queues::{Queues, Work};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Mutex;

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

pub struct SimDevice {
    info: DeviceInfo,
    capacity_chunks: usize,
    memfd: OwnedFd,
    state: Mutex<SimState>,
}

/// What a synchronisation waits for.
#[derive(Clone, Copy)]
enum Need {
    StreamIdle(u64),
    EventDone(u64),
}

struct SimState {
    reservations: BTreeMap<DevicePtr, usize>,
    /// Granule-aligned VA → (chunk, accessible).
    mappings: BTreeMap<DevicePtr, (PhysHandle, bool)>,
    live_chunks: HashSet<u64>,
    /// For each mapped chunk, the addresses it is mapped at (CUDA allows several).
    mapped_chunks: HashMap<u64, Vec<DevicePtr>>,
    free_slots: Vec<u64>,
    next_slot: u64,
    pinned: BTreeMap<HostPtr, usize>,
    plain: HashMap<DevicePtr, usize>,
    queues: Queues,
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

impl SimDevice {
    /// A simulated device with `hbm_bytes` of memory (rounded down to whole granules).
    /// Refused if host memory could not hold it: host memory stands in for its HBM.
    pub fn new(hbm_bytes: usize) -> Result<Self> {
        if let Some(host) = crate::HostMemory::read().filter(|host| hbm_bytes > host.available) {
            return Err(DeviceError::Config(format!(
                "a simulated device of {:.2} GiB is more than the {:.2} GiB of host memory available, which stands in for its HBM: set TIERMEM_SIM_HBM (or the HBM cap the simulated device is sized from) lower",
                hbm_bytes as f64 / (1u64 << 30) as f64,
                host.available as f64 / (1u64 << 30) as f64
            )));
        }
        let capacity_chunks = hbm_bytes / SIM_GRANULARITY;
        // SAFETY: memfd_create takes a NUL-terminated name and flags; it returns a new fd or -1.
        let fd = unsafe { libc::memfd_create(c"tiermem-sim-hbm".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(DeviceError::os("memfd_create"));
        }
        // SAFETY: fd was just returned by memfd_create and is owned by nobody else.
        let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
        let size = (capacity_chunks * SIM_GRANULARITY) as libc::off_t;
        // SAFETY: plain syscall on an fd we own; the file stays sparse until written.
        if unsafe { libc::ftruncate(memfd.as_raw_fd(), size) } != 0 {
            return Err(DeviceError::os("ftruncate"));
        }
        let info = DeviceInfo {
            backend: BackendKind::Sim,
            ordinal: 0,
            name: "tiermem simulated device".into(),
            device_count: 1,
            driver_version: "none (simulated)".into(),
            cuda_version: "none (simulated)".into(),
            total_bytes: capacity_chunks * SIM_GRANULARITY,
            granularity: SIM_GRANULARITY,
            vmm_supported: true,
            peers: Vec::new(),
        };
        let state = SimState {
            reservations: BTreeMap::new(),
            mappings: BTreeMap::new(),
            live_chunks: HashSet::new(),
            mapped_chunks: HashMap::new(),
            free_slots: Vec::new(),
            next_slot: 0,
            pinned: BTreeMap::new(),
            plain: HashMap::new(),
            queues: Queues::new(0x5eed_cafe ^ hbm_bytes as u64),
            fault: None,
            faults: RandomFaults::default(),
            next_handle: 0,
        };
        Ok(Self { info, capacity_chunks, memfd, state: Mutex::new(state) })
    }

    /// When queued work runs besides when it is waited for ([`Timing`]; `Eager` by default).
    /// `Lazy` is the slowest GPU allowed, for tests that must see a missing wait every time.
    pub fn set_timing(&self, timing: Timing) {
        self.lock().queues.set_timing(timing);
    }

    /// Makes about one in `one_in` of the driver calls that can fail on a GPU (those with a
    /// failpoint: create, map, set access, unmap, pin, the asynchronous copies, reserve) fail
    /// with an injected `CUDA_ERROR_UNKNOWN`, chosen by a generator seeded with `seed`; `None`
    /// stops it. Per device, so tests running in parallel do not disturb each other.
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

    /// What is still allocated; all zero once every user has cleaned up.
    pub fn live(&self) -> SimLive {
        let s = self.lock();
        let (streams, events) = s.queues.live();
        SimLive {
            reservations: s.reservations.len(),
            mapped_chunks: s.mappings.len(),
            chunks: s.live_chunks.len(),
            pinned_bytes: s.pinned.values().sum(),
            plain_allocations: s.plain.len(),
            streams,
            events,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SimState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn gran(&self) -> usize {
        SIM_GRANULARITY
    }

    fn invalid(call: &'static str, detail: String) -> DeviceError {
        DeviceError::Driver { call, code: "CUDA_ERROR_INVALID_VALUE".into(), detail }
    }

    fn check_aligned(&self, call: &'static str, va: DevicePtr, size: usize) -> Result<()> {
        let g = self.gran() as u64;
        if va % g != 0 || size == 0 || size as u64 % g != 0 {
            return Err(Self::invalid(call, format!("va=0x{va:x} size={size} not granule-aligned")));
        }
        Ok(())
    }

    /// Whether `[ptr, ptr+len)` is device memory the device may touch now.
    fn device_range_ok(s: &SimState, ptr: DevicePtr, len: usize) -> bool {
        if let Some((&base, &size)) = s.plain.iter().find(|(&b, &sz)| ptr >= b && ptr < b + sz as u64) {
            return ptr + len as u64 <= base + size as u64;
        }
        let g = SIM_GRANULARITY as u64;
        let (first, end) = (ptr - ptr % g, ptr + len as u64);
        (first..end).step_by(g as usize).all(|va| matches!(s.mappings.get(&va), Some((_, true))))
    }

    fn pinned_range_ok(s: &SimState, ptr: HostPtr, len: usize) -> bool {
        s.pinned.range(..=ptr).next_back().is_some_and(|(&base, &size)| ptr + len <= base + size)
    }

    fn check_device(&self, call: &'static str, ptr: DevicePtr, len: usize) -> Result<()> {
        if len == 0 || Self::device_range_ok(&self.lock(), ptr, len) {
            Ok(())
        } else {
            Err(DeviceError::Fault(format!("{call}: device range 0x{ptr:x}+{len} is not mapped with access")))
        }
    }

    fn check_pinned(&self, call: &'static str, ptr: HostPtr, len: usize) -> Result<()> {
        if len == 0 || Self::pinned_range_ok(&self.lock(), ptr, len) {
            Ok(())
        } else {
            Err(DeviceError::Fault(format!("{call}: host range 0x{ptr:x}+{len} is not pinned memory")))
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
                Self::perform(s, work);
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

impl Drop for SimDevice {
    fn drop(&mut self) {
        let s = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for (&va, &size) in &s.reservations {
            // SAFETY: the range was mapped by `reserve` and nothing else refers to it now.
            unsafe { libc::munmap(va as *mut libc::c_void, size) };
        }
        let host = s.pinned.iter().map(|(&p, &n)| (p, n));
        for (ptr, size) in host.chain(s.plain.iter().map(|(&p, &n)| (p as usize, n))) {
            // SAFETY: these are our own anonymous mappings, unreachable once the device is gone.
            unsafe { libc::munmap(ptr as *mut libc::c_void, size) };
        }
    }
}

// The `Device` calls themselves (after `failpoint!`, which they use).
mod driver;
