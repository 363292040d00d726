//! [`VramStore`]: the swap device's bytes in the tiermem engine — HBM first, spilling through
//! a small pinned host tier to a file — cut into areas (areas.rs) that exist only while they
//! hold a page, under limits that give VRAM back to GPU work (limits.rs, monitor.rs).
//!
//! # A request
//!
//! A request is split at area boundaries; each piece takes its area's lock (shared or
//! exclusive: areas.rs) and nothing else the other pieces take, so requests to different areas
//! run in parallel, and nothing global is held across an engine call. Within an area, engine
//! calls are split where a chunk ends (one chunk pinned per call: gate.rs) and, for reads, where
//! the present bits change: pages not present are zero-filled in the output and the engine is
//! not asked. Writes allocate the area's buffer on first use, zero-fill the rest of a partial
//! page not present, write, then set the bits. Discards clear the bits of whole pages, zero
//! the bytes of partial ones, and free the buffer when its last page goes.
//!
//! # Failures
//!
//! An engine error fails the request with [`SwapError::Engine`] (EIO) and nothing else: a
//! first write that fails frees the buffer it allocated, so the area is as it was; a later
//! write that fails leaves the bits as they were (bytes in its own range are undefined, as
//! for any failed block write); a discard whose free fails keeps the buffer with no page
//! present (the next discard of the area frees it). A multi-area request may have done its
//! first pieces when a later one fails.
//!
//! # Allocation on the request path
//!
//! The store allocates nothing per request: areas and bits are allocated at open, zeros come
//! from a static page, runs of bits are iterated in place, the gate is a mutex and a condition
//! variable, and each copy runs in a lane (lanes.rs: a stream and a pinned chunk made at open).
//! What remains is the engine's: each acquire builds a small vector of the chunks it pins (a
//! page-in from the file copies through the file tier's preallocated staging), and the first
//! write to an area allocates its buffer's descriptor — a few hundred bytes per 2 MiB written. The serving process should lock its memory (`mlockall`) and
//! keep a margin of free heap; the front end's docs say how.

use crate::areas::{Area, Backing, PresentBits, PAGE};
use crate::config::{StoreConfig, DEFAULT_HOST_STAGING};
use crate::gate::Gate;
use crate::lanes::{Lane, Lanes};
use crate::limits::Limits;
use crate::monitor::{held, Applied, Governor, Monitor};
use crate::stats::{Counters, StoreStats};
use crate::{Blocks, SwapError};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, RwLockReadGuard, RwLockWriteGuard};
use tiermem::mechanism::Device;
use tiermem::Tier;
use tiermem::{format_size, Access, AllocOptions, Engine, Region};

static ZEROS: [u8; PAGE as usize] = [0; PAGE as usize];

/// Engine copies in flight at once, each with a stream and a pinned chunk (lanes.rs): more than
/// the server's threads (at most 8 by default), so that a request rarely waits for one.
const LANES: usize = 16;

/// A block store over the tiermem engine, served by a front end as a swap device.
///
/// Thread safety: `Send + Sync`; any number of threads may call [`Blocks`] methods at once.
/// Dropping it stops the monitor and frees every engine buffer (and removes the spill file).
pub struct VramStore {
    // Dropped first: the monitor thread holds a reference to `shared` until joined.
    _monitor: Option<Monitor>,
    shared: Arc<Shared>,
}

struct Shared {
    engine: Engine,
    size: u64,
    area_size: u64,
    chunk: u64,
    areas: Box<[Area]>,
    present: PresentBits,
    gate: Gate,
    lanes: Lanes,
    counters: Counters,
    governor: Governor,
}

fn engine_error(call: &'static str) -> impl FnOnce(tiermem::Error) -> SwapError {
    move |source| SwapError::Engine { call, source }
}

fn shared(area: &Area) -> RwLockReadGuard<'_, Option<Backing>> {
    // The slot is one word, written only after the engine call it records succeeded.
    area.buffer.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn exclusive(area: &Area) -> RwLockWriteGuard<'_, Option<Backing>> {
    area.buffer.write().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl VramStore {
    /// Opens the engine, checks that the device fits, applies the limits once and starts the
    /// monitor. Refuses a size the tiers could never hold: more than the VRAM the limits
    /// allow (the GPU's memory less `soft_free`), the host staging tier and the spill file
    /// together.
    pub fn open(config: StoreConfig) -> Result<Self, SwapError> {
        config.check()?;
        let call = "VramStore::open";
        let refuse = |detail: String| SwapError::Config { call, detail };
        let mut engine_config = config.engine.clone();
        let grant = match (engine_config.hbm_limit, config.external_cap) {
            (Some(limit), Some(cap)) => Some((limit as u64).min(cap)),
            (limit, cap) => cap.or(limit.map(|l| l as u64)),
        };
        // The engine starts at the least budget (at least a 2 MiB chunk, which the engine
        // requires of a cap); the first step below sets the real one.
        engine_config.hbm_limit = Some(config.limits.min_budget.max(2 << 20) as usize);
        engine_config.host_limit = engine_config.host_limit.or(Some(DEFAULT_HOST_STAGING));
        let engine = Engine::new(engine_config).map_err(engine_error(call))?;
        let chunk = engine.chunk_size() as u64;
        let area_size = config.area_size.unwrap_or(chunk);
        if !area_size.is_multiple_of(chunk) {
            return Err(refuse(format!("area_size {area_size} is not a multiple of the engine's {chunk}-byte chunk")));
        }
        let total = engine.device_info().total_bytes as u64;
        let floor = config.limits.min_chunks(chunk) * chunk;
        if floor > total {
            return Err(refuse(format!(
                "min_budget of {} is more than the GPU's {}; lower it",
                format_size(floor as usize),
                format_size(total as usize)
            )));
        }
        let tiers = engine.summary();
        let vram = total.saturating_sub(config.limits.soft_free).max(floor);
        let (host, file) = (
            tiers.tiers[Tier::Host].capacity_bytes as u64,
            tiers.tiers.get(Tier::File).map_or(0, |f| f.capacity_bytes as u64),
        );
        if config.size > vram + host + file {
            return Err(refuse(format!(
                "a device of {} cannot fit: the limits leave it {} of VRAM, the host staging tier holds {} and the spill file {}; give a larger spill file (file_limit) or a smaller size",
                format_size(config.size as usize),
                format_size(vram as usize),
                format_size(host as usize),
                format_size(file as usize)
            )));
        }
        let lanes = Lanes::new(Arc::clone(engine.device()), LANES, chunk as usize)
            .map_err(|source| SwapError::Engine { call, source: tiermem::Error::Device { call: "lanes", source } })?;
        let shared = Arc::new(Shared {
            engine,
            size: config.size,
            area_size,
            chunk,
            areas: (0..config.size.div_ceil(area_size)).map(|_| Area::default()).collect(),
            present: PresentBits::new(config.size / PAGE),
            gate: Gate::new(config.limits.min_chunks(chunk)),
            lanes,
            counters: Counters::default(),
            governor: Governor::new(config.limits, grant),
        });
        shared.governor.apply(&shared.engine)?;
        let monitor = match config.poll {
            None => None,
            Some(poll) => {
                let watched = Arc::clone(&shared);
                // A failed step is counted in the stats; the next one tries again.
                Some(Monitor::spawn(poll, move || {
                    let _ = watched.governor.apply(&watched.engine);
                })?)
            }
        };
        Ok(Self { _monitor: monitor, shared })
    }

    /// The engine beneath (for `tiermem swap status` and benchmarks); its budget is the
    /// monitor's to set.
    pub fn engine(&self) -> &Engine {
        &self.shared.engine
    }

    /// Replaces the limits and applies them at once; returns what the step did.
    pub fn set_limits(&self, limits: Limits) -> Result<Applied, SwapError> {
        let s = &self.shared;
        s.governor.set_limits(&s.engine, &s.gate, limits)
    }

    /// Sets the node daemon's grant (`None`: no grant) and applies it at once, returning when
    /// it is met: the data beyond it has moved down and its HBM gone back to the driver. The
    /// returned step's `give_back` says how much moved, how long it took, and what is still
    /// held (more than the grant only where the host staging tier and the spill file are full,
    /// or below `min_budget`, which a grant cannot go under).
    pub fn set_external_cap(&self, cap: Option<u64>) -> Result<Applied, SwapError> {
        let s = &self.shared;
        s.governor.set_external_cap(&s.engine, cap)
    }

    /// Runs one monitor step now (what the monitor thread does every poll).
    pub fn apply_limits(&self) -> Result<Applied, SwapError> {
        self.shared.governor.apply(&self.shared.engine)
    }

    /// A snapshot for `tiermem swap status`. Takes the engine's lock once (`Engine::summary`).
    pub fn stats(&self) -> StoreStats {
        let s = &self.shared;
        let engine = s.engine.summary();
        let control = s.governor.control();
        StoreStats {
            size: s.size,
            area_size: s.area_size,
            areas: s.areas.len() as u64,
            areas_live: s.counters.areas_live.load(Relaxed),
            bytes_present: s.counters.pages_present.load(Relaxed) * PAGE,
            hbm_bytes: engine.tiers[Tier::Hbm].used_bytes as u64,
            host_bytes: engine.tiers[Tier::Host].used_bytes as u64,
            file_bytes: engine.tiers.get(Tier::File).map_or(0, |f| f.used_bytes as u64),
            file_capacity: engine.tiers.get(Tier::File).map_or(0, |f| f.capacity_bytes as u64),
            hbm_budget: engine.tiers[Tier::Hbm].capacity_bytes as u64,
            limits: control.limits,
            external_cap: control.external_cap,
            gpu: control.reading,
            pressure: control.pressure,
            requests: s.counters.requests(),
            give_backs: control.give_backs,
            monitor_errors: control.errors,
            last_monitor_error: control.last_error.clone(),
        }
    }

    /// HBM holding the store's data now, in bytes.
    pub fn hbm_held(&self) -> u64 {
        held(&self.shared.engine)
    }
}

impl Shared {
    fn check(&self, call: &'static str, offset: u64, len: u64) -> Result<(), SwapError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(SwapError::OutOfRange { call, offset, len, size: self.size }),
        }
    }

    /// Splits `offset..offset + len` at area boundaries: `(area, start, end)` in device bytes.
    fn pieces(&self, offset: u64, len: u64) -> impl Iterator<Item = (usize, u64, u64)> + '_ {
        let end = offset + len;
        let mut at = offset;
        std::iter::from_fn(move || {
            if at >= end {
                return None;
            }
            let area = at / self.area_size;
            let piece = (at, end.min((area + 1) * self.area_size));
            at = piece.1;
            Some((area as usize, piece.0, piece.1))
        })
    }

    /// Device bytes `start..end` (inside one area) as `(offset in the area's buffer, len)`
    /// pieces that each stay inside one chunk.
    fn chunk_pieces(&self, start: u64, end: u64) -> impl Iterator<Item = (usize, usize)> + '_ {
        let base = start / self.area_size * self.area_size;
        let mut at = start;
        std::iter::from_fn(move || {
            if at >= end {
                return None;
            }
            let to = end.min((at / self.chunk + 1) * self.chunk);
            let piece = ((at - base) as usize, (to - at) as usize);
            at = to;
            Some(piece)
        })
    }

    /// Writes `data` at device offset `start` into `buffer`, one chunk per engine call.
    fn engine_write(&self, call: &'static str, buffer: Backing, start: u64, data: &[u8]) -> Result<(), SwapError> {
        let mut done = 0;
        for (at, len) in self.chunk_pieces(start, start + data.len() as u64) {
            let _pass = self.gate.enter();
            let lane = self.lanes.take();
            let src = &data[done..done + len];
            self.in_lane(call, &lane, buffer, (at, len), Access::ReadWrite, |device, va| {
                // SAFETY: the lane's staging is `lane.size` (a chunk) bytes of pinned memory that
                // only this lane's holder touches; a piece never exceeds a chunk.
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), lane.staging as *mut u8, len) };
                // SAFETY: the staging stays untouched until `in_lane` synchronizes the stream.
                unsafe { device.copy_to_device_async(va, lane.staging, len, lane.stream) }
                    .map_err(|source| tiermem::Error::Device { call: "cuMemcpyHtoDAsync", source })
            })?;
            done += len;
        }
        Ok(())
    }

    fn engine_read(&self, call: &'static str, buffer: Backing, start: u64, out: &mut [u8]) -> Result<(), SwapError> {
        let mut done = 0;
        for (at, len) in self.chunk_pieces(start, start + out.len() as u64) {
            let _pass = self.gate.enter();
            let lane = self.lanes.take();
            self.in_lane(call, &lane, buffer, (at, len), Access::ReadOnly, |device, va| {
                // SAFETY: as in `engine_write`; the staging is read only after the stream is synchronized.
                unsafe { device.copy_to_host_async(lane.staging, va, len, lane.stream) }
                    .map_err(|source| tiermem::Error::Device { call: "cuMemcpyDtoHAsync", source })
            })?;
            // SAFETY: the copy into the staging has completed (`in_lane` synchronized the stream).
            unsafe { std::ptr::copy_nonoverlapping(lane.staging as *const u8, out[done..].as_mut_ptr(), len) };
            done += len;
        }
        Ok(())
    }

    /// Acquires the `(at, len)` bytes of `buffer` (inside one chunk) on the lane's stream,
    /// enqueues `copy` at their device address on that stream, waits for the stream, and
    /// releases them, also on failure.
    fn in_lane(
        &self,
        call: &'static str,
        lane: &Lane,
        buffer: Backing,
        (at, len): (usize, usize),
        access: Access,
        copy: impl FnOnce(&dyn Device, u64) -> tiermem::Result<()>,
    ) -> Result<(), SwapError> {
        let regions = [Region::bytes(buffer.id, at, len)];
        self.engine.acquire(&regions, access, lane.stream).map_err(engine_error(call))?;
        let device = self.lanes.device();
        let copied = copy(device, buffer.va + at as u64).and_then(|()| {
            device
                .synchronize_stream(lane.stream)
                .map_err(|source| tiermem::Error::Device { call: "cuStreamSynchronize", source })
        });
        let released = self.engine.release(&regions, lane.stream);
        copied.and(released).map_err(engine_error(call))
    }

    /// Writes zeros over device bytes `start..end` of `buffer`.
    fn engine_zero(&self, call: &'static str, buffer: Backing, start: u64, end: u64) -> Result<(), SwapError> {
        let mut at = start;
        while at < end {
            let len = (end - at).min(PAGE);
            self.engine_write(call, buffer, at, &ZEROS[..len as usize])?;
            at += len;
        }
        Ok(())
    }

    fn area_len(&self, area: usize) -> u64 {
        self.area_size.min(self.size - area as u64 * self.area_size)
    }

    fn read_area(&self, area: usize, start: u64, out: &mut [u8]) -> Result<(), SwapError> {
        let call = "VramStore::read";
        let slot = shared(&self.areas[area]);
        let Some(buffer) = *slot else {
            out.fill(0);
            return Ok(());
        };
        let end = start + out.len() as u64;
        for (first, last, present) in self.present.runs(start / PAGE, end.div_ceil(PAGE)) {
            let (from, to) = (start.max(first * PAGE), end.min(last * PAGE));
            let bytes = &mut out[(from - start) as usize..(to - start) as usize];
            if present {
                self.engine_read(call, buffer, from, bytes)?;
            } else {
                bytes.fill(0);
            }
        }
        Ok(())
    }

    fn write_area(&self, area: usize, start: u64, data: &[u8]) -> Result<(), SwapError> {
        let call = "VramStore::write";
        let end = start + data.len() as u64;
        let (first, last) = (start / PAGE, (end - 1) / PAGE);
        // Partial pages not present must be zero-filled around the data, under the exclusive lock.
        let needs_fill = || {
            (!start.is_multiple_of(PAGE) && !self.present.is_set(first))
                || (!end.is_multiple_of(PAGE) && !self.present.is_set(last))
        };
        {
            let slot = shared(&self.areas[area]);
            if let (Some(buffer), false) = (*slot, needs_fill()) {
                self.engine_write(call, buffer, start, data)?;
                self.mark_present(first, last + 1);
                return Ok(());
            }
        }
        let mut slot = exclusive(&self.areas[area]);
        let (buffer, fresh) = match *slot {
            Some(buffer) => (buffer, false),
            None => {
                let (id, va) = self
                    .engine
                    .alloc(self.area_len(area) as usize, AllocOptions::default())
                    .map_err(engine_error(call))?;
                (Backing { id, va }, true)
            }
        };
        let written = (|| {
            // A fresh buffer reads as zeros already.
            if !fresh && !start.is_multiple_of(PAGE) && !self.present.is_set(first) {
                self.engine_zero(call, buffer, first * PAGE, start)?;
            }
            if !fresh && !end.is_multiple_of(PAGE) && !self.present.is_set(last) {
                self.engine_zero(call, buffer, end, (last + 1) * PAGE)?;
            }
            self.engine_write(call, buffer, start, data)
        })();
        match written {
            Ok(()) => {
                if fresh {
                    *slot = Some(buffer);
                    self.counters.areas_live.fetch_add(1, Relaxed);
                }
                self.mark_present(first, last + 1);
                Ok(())
            }
            Err(e) => {
                if fresh {
                    // Nothing was registered: the area stays as it was. A failed free leaves an
                    // unreachable buffer in the engine (freed with it), never a wrong byte.
                    let _ = self.engine.free(buffer.id);
                }
                Err(e)
            }
        }
    }

    fn mark_present(&self, first: u64, end: u64) {
        self.counters.pages_present.fetch_add(self.present.set(first, end), Relaxed);
    }

    fn discard_area(&self, area: usize, start: u64, end: u64) -> Result<(), SwapError> {
        let call = "VramStore::discard";
        if shared(&self.areas[area]).is_none() {
            return Ok(()); // no buffer: no page present (areas.rs), nothing to forget
        }
        let mut slot = exclusive(&self.areas[area]);
        let Some(buffer) = *slot else { return Ok(()) };
        let (whole_first, whole_end) = (start.div_ceil(PAGE), end / PAGE);
        // Bytes of pages covered only in part: zeroed, the page stays present (areas.rs).
        let head_end = end.min(whole_first * PAGE);
        if start < head_end && self.present.is_set(start / PAGE) {
            self.engine_zero(call, buffer, start, head_end)?;
        }
        let tail_start = start.max(whole_end * PAGE);
        if tail_start < end && tail_start >= head_end && self.present.is_set(tail_start / PAGE) {
            self.engine_zero(call, buffer, tail_start, end)?;
        }
        if whole_first < whole_end {
            self.counters.pages_present.fetch_sub(self.present.clear(whole_first, whole_end), Relaxed);
        }
        let area_pages =
            (area as u64 * self.area_size / PAGE, (area as u64 * self.area_size + self.area_len(area)) / PAGE);
        if !self.present.any(area_pages.0, area_pages.1) {
            self.engine.free(buffer.id).map_err(engine_error(call))?;
            *slot = None;
            self.counters.areas_live.fetch_sub(1, Relaxed);
        }
        Ok(())
    }

    /// Runs `op` on each area piece of a checked request, counting it and any failure.
    fn each_piece(
        &self,
        call: &'static str,
        offset: u64,
        len: u64,
        mut op: impl FnMut(usize, u64, u64) -> Result<(), SwapError>,
    ) -> Result<(), SwapError> {
        let outcome = self.check(call, offset, len).and_then(|()| {
            for (area, start, end) in self.pieces(offset, len) {
                op(area, start, end)?;
            }
            Ok(())
        });
        if outcome.is_err() {
            self.counters.errors.fetch_add(1, Relaxed);
        }
        outcome
    }
}

impl Blocks for VramStore {
    fn size(&self) -> u64 {
        self.shared.size
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), SwapError> {
        let s = &*self.shared;
        Counters::count(&s.counters.reads, &s.counters.bytes_read, out.len() as u64);
        s.each_piece("VramStore::read", offset, out.len() as u64, |area, start, end| {
            let bytes = &mut out[(start - offset) as usize..(end - offset) as usize];
            s.read_area(area, start, bytes)
        })
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), SwapError> {
        let s = &*self.shared;
        Counters::count(&s.counters.writes, &s.counters.bytes_written, data.len() as u64);
        s.each_piece("VramStore::write", offset, data.len() as u64, |area, start, end| {
            s.write_area(area, start, &data[(start - offset) as usize..(end - offset) as usize])
        })
    }

    fn discard(&self, offset: u64, len: u64) -> Result<(), SwapError> {
        let s = &*self.shared;
        Counters::count(&s.counters.discards, &s.counters.bytes_discarded, len);
        s.each_piece("VramStore::discard", offset, len, |area, start, end| s.discard_area(area, start, end))
    }
}
