//! The simulated device's answers to the `Device` calls: reservations, chunks, mappings and
//! pinned memory act at once; copies, memsets, kernels and event records are queued and run
//! as mod.rs says.

use super::work::Op;
use super::*;

/// Anonymous private mapping of `size` bytes with `prot`, at `fixed` if given.
fn anon_map(size: usize, prot: libc::c_int, fixed: Option<usize>) -> Result<usize> {
    let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    if fixed.is_some() {
        flags |= libc::MAP_FIXED;
    }
    let addr = fixed.unwrap_or(0) as *mut libc::c_void;
    // SAFETY: an anonymous mapping; with MAP_FIXED the caller guarantees the range is its own.
    let p = unsafe { libc::mmap(addr, size, prot, flags, -1, 0) };
    if p == libc::MAP_FAILED {
        return Err(DeviceError::os("mmap"));
    }
    Ok(p as usize)
}

impl Device for SimDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn mem_info(&self) -> Result<(usize, usize)> {
        let used = self.lock().memory.used(self.info.ordinal);
        Ok((self.info.total_bytes - used * self.gran(), self.info.total_bytes))
    }

    fn gpu_memory(&self, ordinal: usize) -> Result<GpuMemory> {
        if ordinal >= self.info.device_count {
            return Err(DeviceError::NoDevice(format!(
                "GPU {ordinal}: the simulated node has {} GPU(s)",
                self.info.device_count
            )));
        }
        let state = self.lock();
        let used = state.memory.used(ordinal) * self.gran();
        let busy_percent = Some(state.busy.get(&ordinal).copied().unwrap_or(0));
        Ok(GpuMemory {
            free: self.info.total_bytes - used,
            total: self.info.total_bytes,
            other_processes: None,
            busy_percent,
        })
    }

    fn neighbour(&self, ordinal: usize) -> Result<std::sync::Arc<dyn Device>> {
        self.gpu_memory(ordinal)?;
        Ok(std::sync::Arc::new(self.sibling(ordinal)))
    }

    fn reserve(&self, size: usize) -> Result<DevicePtr> {
        failpoint!(self, "cuMemAddressReserve");
        let g = self.gran();
        if size == 0 || !size.is_multiple_of(g) {
            return Err(Self::invalid("cuMemAddressReserve", format!("size={size}")));
        }
        // Over-reserve by one granule, then trim, so the range is granule-aligned as on a GPU.
        let raw = anon_map(size + g, libc::PROT_NONE, None)?;
        let va = raw.next_multiple_of(g);
        let (head, tail) = (va - raw, raw + g - va);
        // SAFETY: both trimmed pieces lie inside the mapping just made and are not used.
        unsafe {
            if head > 0 {
                libc::munmap(raw as *mut libc::c_void, head);
            }
            if tail > 0 {
                libc::munmap((va + size) as *mut libc::c_void, tail);
            }
        }
        self.lock().reservations.insert(va as u64, size);
        Ok(va as u64)
    }

    fn unreserve(&self, va: DevicePtr, size: usize) -> Result<()> {
        let mut s = self.lock();
        if s.reservations.get(&va) != Some(&size) {
            return Err(Self::invalid("cuMemAddressFree", format!("va=0x{va:x} size={size} is not a reservation")));
        }
        if s.mappings.range(va..va + size as u64).next().is_some() {
            return Err(Self::invalid("cuMemAddressFree", format!("va=0x{va:x} still has mapped chunks")));
        }
        s.reservations.remove(&va);
        // SAFETY: the reservation is ours and nothing is mapped in it any more.
        if unsafe { libc::munmap(va as *mut libc::c_void, size) } != 0 {
            return Err(DeviceError::os("munmap"));
        }
        Ok(())
    }

    fn create_chunk_at(&self, location: ChunkLocation) -> Result<PhysHandle> {
        fail::fail_point!("cuMemCreate", |_| Err(DeviceError::OutOfMemory {
            call: "cuMemCreate",
            detail: "injected by failpoint".into(),
        }));
        self.injected("cuMemCreate")?;
        self.lock().memory.create(location)
    }

    fn create_chunks_at(&self, location: ChunkLocation, granules: usize) -> Result<PhysHandle> {
        if granules == 1 {
            return self.create_chunk_at(location);
        }
        let mut members = Vec::with_capacity(granules);
        for _ in 0..granules {
            match self.create_chunk_at(location) {
                Ok(chunk) => members.push(chunk),
                Err(e) => {
                    let mut s = self.lock();
                    members.into_iter().for_each(|c| s.memory.release(c));
                    return Err(e);
                }
            }
        }
        let mut s = self.lock();
        s.next_group += 1;
        let handle = GROUP_HANDLES | s.next_group;
        s.groups.insert(handle, members);
        Ok(PhysHandle(handle))
    }

    fn create_shareable_chunks_at(&self, location: ChunkLocation, granules: usize) -> Result<PhysHandle> {
        fail::fail_point!("cuMemCreate", |_| Err(DeviceError::OutOfMemory {
            call: "cuMemCreate",
            detail: "injected by failpoint".into(),
        }));
        self.injected("cuMemCreate")?;
        self.lock().memory.create_shareable(location, granules)
    }

    fn export_chunk(&self, chunk: PhysHandle) -> Result<std::os::fd::OwnedFd> {
        failpoint!(self, "cuMemExportToShareableHandle");
        let s = self.lock();
        if s.released_mapped.contains(&chunk.0) {
            let detail = format!("handle 0x{:x} was given up (release_mapped_chunk)", chunk.0);
            return Err(Self::invalid("cuMemExportToShareableHandle", detail));
        }
        s.memory.export(chunk)
    }

    fn import_chunk(&self, fd: std::os::fd::BorrowedFd<'_>, size: usize) -> Result<PhysHandle> {
        failpoint!(self, "cuMemImportFromShareableHandle");
        self.lock().memory.import(fd, size)
    }

    fn map_sized(&self, va: DevicePtr, chunk: PhysHandle, size: usize) -> Result<()> {
        let parts = self.parts(chunk);
        if size != parts.len() * self.gran() {
            let detail = format!("size={size} for an allocation of {} granule(s)", parts.len());
            return Err(Self::invalid("cuMemMap", detail));
        }
        // One `cuMemMap`, which fails or succeeds whole: one failpoint, and a mapping that
        // fails part way (a bad address) is undone past the failpoints.
        failpoint!(self, "cuMemMap");
        for (i, &(part, granule)) in parts.iter().enumerate() {
            if let Err(e) = self.map_granule(va + (i * self.gran()) as u64, part, granule, (va, size)) {
                if i > 0 {
                    let g = self.gran();
                    Self::unmap_granules(&mut self.lock_progressing(), g as u64, va, i * g)
                        .expect("the granules just mapped");
                }
                return Err(e);
            }
        }
        Ok(())
    }

    fn release_chunk(&self, chunk: PhysHandle) -> Result<()> {
        if let Some(members) = self.group_members(chunk) {
            // Refused, like CUDA, while any part is mapped; else every part goes.
            let mut s = self.lock_progressing();
            if let Some(va) = members.iter().find_map(|c| s.mapped_chunks.get(&c.0).and_then(|vas| vas.first())) {
                return Err(Self::invalid(
                    "cuMemRelease",
                    format!("allocation {} is still mapped at 0x{va:x}", chunk.0),
                ));
            }
            s.groups.remove(&chunk.0);
            members.into_iter().for_each(|c| s.memory.release(c));
            return Ok(());
        }
        let mut s = self.lock_progressing();
        if !s.memory.is_live(chunk) {
            return Err(Self::invalid("cuMemRelease", format!("chunk {} is not live", chunk.0)));
        }
        if let Some(va) = s.mapped_chunks.get(&chunk.0).and_then(|vas| vas.first()) {
            return Err(Self::invalid("cuMemRelease", format!("chunk {} is still mapped at 0x{va:x}", chunk.0)));
        }
        s.memory.release(chunk);
        Ok(())
    }

    fn release_mapped_chunk(&self, chunk: PhysHandle) -> Result<()> {
        if let Some(members) = self.group_members(chunk) {
            self.lock().groups.remove(&chunk.0);
            return members.into_iter().try_for_each(|c| self.release_mapped_chunk(c));
        }
        let mut s = self.lock_progressing();
        if !s.memory.is_live(chunk) || s.released_mapped.contains(&chunk.0) {
            return Err(Self::invalid("cuMemRelease", format!("chunk {} is not live", chunk.0)));
        }
        match s.mapped_chunks.contains_key(&chunk.0) {
            true => drop(s.released_mapped.insert(chunk.0)),
            false => s.memory.release(chunk),
        }
        Ok(())
    }

    fn map(&self, va: DevicePtr, chunk: PhysHandle) -> Result<()> {
        self.map_sized(va, chunk, self.gran())
    }

    fn set_access_from(&self, va: DevicePtr, size: usize, gpus: &[usize]) -> Result<()> {
        failpoint!(self, "cuMemSetAccess");
        self.check_aligned("cuMemSetAccess", va, size)?;
        let mut s = self.lock_progressing();
        let g = self.gran() as u64;
        let count = self.info.device_count;
        if let Some(bad) = gpus.iter().find(|&&gpu| gpu >= count) {
            return Err(DeviceError::Driver {
                call: "cuMemSetAccess",
                code: "CUDA_ERROR_INVALID_DEVICE".into(),
                detail: format!("access from GPU {bad}, but the simulated node has {count} GPU(s)"),
            });
        }
        if gpus.is_empty() {
            return Err(Self::invalid("cuMemSetAccess", format!("va=0x{va:x} size={size}: no GPU to give access to")));
        }
        for a in (va..va + size as u64).step_by(g as usize) {
            let Some(m) = s.mappings.get(&a) else {
                return Err(Self::invalid("cuMemSetAccess", format!("va=0x{va:x} size={size} is not fully mapped")));
            };
            // An imported allocation's home is not known here: any GPU may reach it.
            let Some(home) = s.memory.location(m.chunk) else { continue };
            if let Some(gpu) = gpus.iter().find(|&&gpu| !self.can_reach(gpu, home)) {
                return Err(DeviceError::Driver {
                    call: "cuMemSetAccess",
                    code: "CUDA_ERROR_INVALID_DEVICE".into(),
                    detail: format!("GPU {gpu} has no peer access to {home}, where the chunk at 0x{a:x} is"),
                });
            }
        }
        let access = gpus.iter().fold(0u64, |bits, gpu| bits | 1 << gpu);
        // SAFETY: the whole range consists of our own memfd mappings.
        if unsafe { libc::mprotect(va as *mut libc::c_void, size, libc::PROT_READ | libc::PROT_WRITE) } != 0 {
            return Err(DeviceError::os("mprotect"));
        }
        for a in (va..va + size as u64).step_by(g as usize) {
            if let Some(m) = s.mappings.get_mut(&a) {
                m.access |= access;
            }
        }
        Ok(())
    }

    fn unmap(&self, va: DevicePtr, size: usize) -> Result<()> {
        failpoint!(self, "cuMemUnmap");
        self.unmap_range(va, size)
    }
    fn alloc_pinned(&self, size: usize) -> Result<HostPtr> {
        failpoint!(self, "cuMemHostAlloc");
        if size == 0 {
            return Err(Self::invalid("cuMemHostAlloc", "size=0".into()));
        }
        let p = anon_map(size, libc::PROT_READ | libc::PROT_WRITE, None)?;
        self.lock().pinned.insert(p, size);
        Ok(p)
    }

    fn free_pinned(&self, ptr: HostPtr, size: usize) -> Result<()> {
        let mut s = self.lock_progressing();
        if s.pinned.get(&ptr) != Some(&size) {
            return Err(Self::invalid("cuMemFreeHost", format!("0x{ptr:x} is not pinned memory of size {size}")));
        }
        s.pinned.remove(&ptr);
        // SAFETY: our own anonymous mapping, no longer referenced.
        unsafe { libc::munmap(ptr as *mut libc::c_void, size) };
        Ok(())
    }

    fn create_stream(&self, _priority: StreamPriority) -> Result<StreamHandle> {
        let mut s = self.lock();
        let h = Self::new_handle(&mut s);
        s.queues.add_stream(h);
        s.stream_gpus.insert(h, self.info.ordinal);
        Ok(StreamHandle(h))
    }

    fn destroy_stream(&self, stream: StreamHandle) -> Result<()> {
        let mut s = self.lock();
        let id = Self::stream_of(&s, "cuStreamDestroy", stream)?;
        // As cuStreamDestroy: work already enqueued still completes.
        Self::run_until(&mut s, "cuStreamDestroy", Need::StreamIdle(id))?;
        if !s.queues.remove_stream(id) {
            return Err(Self::invalid("cuStreamDestroy", "the legacy stream cannot be destroyed".into()));
        }
        s.stream_gpus.remove(&id);
        Ok(())
    }

    fn create_event(&self, _timing: bool) -> Result<EventHandle> {
        let mut s = self.lock();
        let h = Self::new_handle(&mut s);
        s.queues.add_event(h);
        Ok(EventHandle(h))
    }

    fn destroy_event(&self, event: EventHandle) -> Result<()> {
        if !self.lock().queues.remove_event(event.0) {
            return Err(Self::invalid("cuEventDestroy", format!("event {} is not live", event.0)));
        }
        Ok(())
    }

    fn record_event(&self, event: EventHandle, stream: StreamHandle) -> Result<()> {
        let mut s = self.lock_progressing();
        let (e, st) = (Self::event_of(&s, "cuEventRecord", event)?, Self::stream_of(&s, "cuEventRecord", stream)?);
        s.queues.record(e, st);
        Ok(())
    }

    fn stream_wait_event(&self, stream: StreamHandle, event: EventHandle) -> Result<()> {
        let mut s = self.lock_progressing();
        let (e, st) =
            (Self::event_of(&s, "cuStreamWaitEvent", event)?, Self::stream_of(&s, "cuStreamWaitEvent", stream)?);
        s.queues.wait(st, e);
        Ok(())
    }

    fn event_done(&self, event: EventHandle) -> Result<bool> {
        let s = self.lock_progressing();
        let e = Self::event_of(&s, "cuEventQuery", event)?;
        Self::check_fault(&s)?;
        Ok(s.queues.event_done(e))
    }

    fn synchronize_event(&self, event: EventHandle) -> Result<()> {
        // Tests pause a host that waits for a fence here (the engine's tests/unlocked_waits.rs).
        fail::fail_point!("cuEventSynchronize::wait");
        let mut s = self.lock();
        let e = Self::event_of(&s, "cuEventSynchronize", event)?;
        Self::run_until(&mut s, "cuEventSynchronize", Need::EventDone(e))
    }

    fn synchronize_stream(&self, stream: StreamHandle) -> Result<()> {
        let mut s = self.lock();
        let id = Self::stream_of(&s, "cuStreamSynchronize", stream)?;
        Self::run_until(&mut s, "cuStreamSynchronize", Need::StreamIdle(id))
    }

    fn elapsed_ms(&self, _start: EventHandle, _end: EventHandle) -> Result<f32> {
        Ok(0.0)
    }

    unsafe fn copy_to_device_async(
        &self,
        dst: DevicePtr,
        src: HostPtr,
        len: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        failpoint!(self, "cuMemcpyHtoDAsync");
        let op = Op::ToDevice { dst, src, len };
        self.enqueue("cuMemcpyHtoDAsync", stream, op, &[(dst, len)], Some((src, len)))
    }

    unsafe fn copy_to_host_async(&self, dst: HostPtr, src: DevicePtr, len: usize, stream: StreamHandle) -> Result<()> {
        failpoint!(self, "cuMemcpyDtoHAsync");
        let op = Op::ToHost { dst, src, len };
        self.enqueue("cuMemcpyDtoHAsync", stream, op, &[(src, len)], Some((dst, len)))
    }

    fn copy_between_devices_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        failpoint!(self, "cuMemcpyDtoDAsync");
        if dst < src + len as u64 && src < dst + len as u64 && len > 0 {
            let detail = format!("dst=0x{dst:x} src=0x{src:x} len={len}: the ranges overlap");
            return Err(Self::invalid("cuMemcpyDtoDAsync", detail));
        }
        let op = Op::Between { dst, src, len };
        self.enqueue("cuMemcpyDtoDAsync", stream, op, &[(dst, len), (src, len)], None)
    }

    fn memset_async(&self, dst: DevicePtr, value: u8, len: usize, stream: StreamHandle) -> Result<()> {
        self.enqueue("cuMemsetD8Async", stream, Op::Memset { dst, value, len }, &[(dst, len)], None)
    }

    fn fill_pattern_async(
        &self,
        dst: DevicePtr,
        words: usize,
        seed: u64,
        first: u64,
        stream: StreamHandle,
    ) -> Result<()> {
        self.enqueue("tiermem_fill", stream, Op::Fill { dst, words, seed, first }, &[(dst, words * 8)], None)
    }

    fn check_pattern_async(
        &self,
        src: DevicePtr,
        words: usize,
        seed: u64,
        first: u64,
        counter: DevicePtr,
        stream: StreamHandle,
    ) -> Result<()> {
        let op = Op::Check { src, words, seed, first, counter };
        self.enqueue("tiermem_check", stream, op, &[(src, words * 8), (counter, 4)], None)
    }

    fn write(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        let mut s = self.lock();
        // A synchronous copy runs on the legacy stream, after the work already there.
        Self::run_until(&mut s, "cuMemcpyHtoD", Need::StreamIdle(0))?;
        Self::check_device(&s, "cuMemcpyHtoD", self.info.ordinal, dst, src.len())?;
        // SAFETY: the destination range was just checked to be mapped with access.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }

    fn read(&self, src: DevicePtr, dst: &mut [u8]) -> Result<()> {
        let mut s = self.lock();
        Self::run_until(&mut s, "cuMemcpyDtoH", Need::StreamIdle(0))?;
        Self::check_device(&s, "cuMemcpyDtoH", self.info.ordinal, src, dst.len())?;
        // SAFETY: the source range was just checked to be mapped with access.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn alloc_plain(&self, size: usize) -> Result<DevicePtr> {
        let p = anon_map(size, libc::PROT_READ | libc::PROT_WRITE, None)? as DevicePtr;
        self.lock().plain.insert(p, (size, self.info.ordinal));
        Ok(p)
    }

    fn free_plain(&self, ptr: DevicePtr) -> Result<()> {
        let (size, _) = self
            .lock()
            .plain
            .remove(&ptr)
            .ok_or_else(|| Self::invalid("cuMemFree", format!("0x{ptr:x} is not a plain allocation")))?;
        // SAFETY: our own anonymous mapping, no longer referenced.
        unsafe { libc::munmap(ptr as *mut libc::c_void, size) };
        Ok(())
    }
}

/// The bit that marks the handle of an allocation of several granules (the simulated
/// device's own chunk handles never set it).
const GROUP_HANDLES: u64 = 1 << 62;

impl SimDevice {
    /// The granule chunks of an allocation of several granules, if `chunk` is one.
    fn group_members(&self, chunk: PhysHandle) -> Option<Vec<PhysHandle>> {
        self.lock().groups.get(&chunk.0).cloned()
    }

    /// The granules a mapping of `chunk` is made of, in order: for each, the chunk whose memory
    /// it is and its index within that memory. A dead handle counts as one granule (whose
    /// mapping then fails).
    fn parts(&self, chunk: PhysHandle) -> Vec<(PhysHandle, usize)> {
        let s = self.lock();
        if let Some(members) = s.groups.get(&chunk.0) {
            return members.iter().map(|&member| (member, 0)).collect();
        }
        let granules = s.memory.shared_granules(chunk).unwrap_or(1);
        (0..granules).map(|granule| (chunk, granule)).collect()
    }

    /// Queues memory work `op` on `stream` (`call` names it in errors), after checking that
    /// the stream's GPU may touch each of `device` ranges now and that `pinned` is pinned;
    /// they are checked again when the work runs.
    fn enqueue(
        &self,
        call: &'static str,
        stream: StreamHandle,
        op: Op,
        device: &[(DevicePtr, usize)],
        pinned: Option<(HostPtr, usize)>,
    ) -> Result<()> {
        let mut s = self.lock_progressing();
        let id = Self::stream_of(&s, call, stream)?;
        let gpu = self.gpu_of(&s, id);
        for &(ptr, len) in device {
            Self::check_device(&s, call, gpu, ptr, len)?;
        }
        if let Some((ptr, len)) = pinned {
            Self::check_pinned(&s, call, ptr, len)?;
        }
        s.queues.enqueue(id, Work::Memory { gpu, op });
        Ok(())
    }

    /// `cuMemMap` of granule `granule` of `chunk`'s memory, past its failpoint.
    fn map_granule(&self, va: DevicePtr, chunk: PhysHandle, granule: usize, whole: (DevicePtr, usize)) -> Result<()> {
        let g = self.gran();
        self.check_aligned("cuMemMap", va, g)?;
        let mut s = self.lock_progressing();
        let inside =
            s.reservations.range(..=va).next_back().is_some_and(|(&base, &size)| va + g as u64 <= base + size as u64);
        let handle_kept = !s.released_mapped.contains(&chunk.0);
        let backing =
            s.memory.backing(chunk, granule).filter(|_| inside && handle_kept && !s.mappings.contains_key(&va));
        let Some((memfd, offset)) = backing else {
            return Err(Self::invalid(
                "cuMemMap",
                format!("va=0x{va:x} chunk={} (outside a reservation, already mapped, or dead chunk)", chunk.0),
            ));
        };
        // SAFETY: va..va+g lies inside a reservation of ours that holds no mapping there.
        let p = unsafe {
            libc::mmap(va as *mut libc::c_void, g, libc::PROT_NONE, libc::MAP_SHARED | libc::MAP_FIXED, memfd, offset)
        };
        if p == libc::MAP_FAILED {
            return Err(DeviceError::os("mmap"));
        }
        s.mappings.insert(va, Mapping { chunk, whole, access: 0 });
        s.mapped_chunks.entry(chunk.0).or_default().push(va);
        Ok(())
    }

    /// `cuMemUnmap`, past its failpoint.
    fn unmap_range(&self, va: DevicePtr, size: usize) -> Result<()> {
        self.check_aligned("cuMemUnmap", va, size)?;
        let mut s = self.lock_progressing();
        let g = self.gran() as u64;
        if !(va..va + size as u64).step_by(g as usize).all(|a| s.mappings.contains_key(&a)) {
            return Err(Self::invalid("cuMemUnmap", format!("va=0x{va:x} size={size} is not fully mapped")));
        }
        let end = va + size as u64;
        let split = (va..end).step_by(g as usize).find_map(|a| {
            let (start, bytes) = s.mappings[&a].whole;
            (start < va || start + bytes as u64 > end).then_some((start, bytes))
        });
        if let Some((start, bytes)) = split {
            let detail = format!("va=0x{va:x} size={size} cuts the mapping of {bytes} bytes at 0x{start:x}");
            return Err(Self::invalid("cuMemUnmap", detail));
        }
        Self::unmap_granules(&mut s, g, va, size)
    }

    /// Unmaps the granules (of `g` bytes) of `[va, va + size)`, all mapped, whatever mappings
    /// they belong to (`unmap_range` past its checks, or a `cuMemMap` undone part way).
    fn unmap_granules(s: &mut SimState, g: u64, va: DevicePtr, size: usize) -> Result<()> {
        anon_map(size, libc::PROT_NONE, Some(va as usize))?;
        for a in (va..va + size as u64).step_by(g as usize) {
            if let Some(Mapping { chunk, .. }) = s.mappings.remove(&a) {
                let vas = s.mapped_chunks.get_mut(&chunk.0).expect("a mapped chunk has its addresses");
                vas.retain(|&v| v != a);
                if vas.is_empty() {
                    s.mapped_chunks.remove(&chunk.0);
                    // Its handle was given up while mapped: its last mapping frees it.
                    if s.released_mapped.remove(&chunk.0) {
                        s.memory.release(chunk);
                    }
                }
            }
        }
        Ok(())
    }
}
