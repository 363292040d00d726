//! The simulated device's answers to the `Device` calls: reservations, chunks, mappings and
//! pinned memory act at once; copies, memsets, kernels and event records are queued and run
//! as mod.rs says.

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
        let used = self.lock().live_chunks.len();
        Ok(((self.capacity_chunks - used) * self.gran(), self.info.total_bytes))
    }

    fn reserve(&self, size: usize) -> Result<DevicePtr> {
        failpoint!(self, "cuMemAddressReserve");
        let g = self.gran();
        if size == 0 || size % g != 0 {
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

    fn create_chunk(&self) -> Result<PhysHandle> {
        fail::fail_point!("cuMemCreate", |_| Err(DeviceError::OutOfMemory {
            call: "cuMemCreate",
            detail: "injected by failpoint".into(),
        }));
        self.injected("cuMemCreate")?;
        let mut s = self.lock();
        if s.live_chunks.len() >= self.capacity_chunks {
            return Err(DeviceError::OutOfMemory {
                call: "cuMemCreate",
                detail: format!("all {} simulated chunks are in use", self.capacity_chunks),
            });
        }
        let slot = s.free_slots.pop().unwrap_or_else(|| {
            s.next_slot += 1;
            s.next_slot - 1
        });
        let poison = vec![POISON; self.gran()];
        let offset = (slot as usize * self.gran()) as libc::off_t;
        // SAFETY: writes our own buffer into our own memfd, inside its size.
        let n = unsafe { libc::pwrite(self.memfd.as_raw_fd(), poison.as_ptr().cast(), poison.len(), offset) };
        if n != poison.len() as isize {
            s.free_slots.push(slot);
            return Err(DeviceError::os("pwrite"));
        }
        s.live_chunks.insert(slot);
        Ok(PhysHandle(slot))
    }

    fn release_chunk(&self, chunk: PhysHandle) -> Result<()> {
        let mut s = self.lock_progressing();
        if !s.live_chunks.contains(&chunk.0) {
            return Err(Self::invalid("cuMemRelease", format!("chunk {} is not live", chunk.0)));
        }
        if let Some(va) = s.mapped_chunks.get(&chunk.0).and_then(|vas| vas.first()) {
            return Err(Self::invalid("cuMemRelease", format!("chunk {} is still mapped at 0x{va:x}", chunk.0)));
        }
        let offset = (chunk.0 as usize * self.gran()) as libc::off_t;
        // SAFETY: punching a hole in our own memfd frees the chunk's memory; no mapping refers to it.
        unsafe {
            libc::fallocate(
                self.memfd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset,
                self.gran() as libc::off_t,
            )
        };
        s.live_chunks.remove(&chunk.0);
        s.free_slots.push(chunk.0);
        Ok(())
    }

    fn map(&self, va: DevicePtr, chunk: PhysHandle) -> Result<()> {
        failpoint!(self, "cuMemMap");
        let g = self.gran();
        self.check_aligned("cuMemMap", va, g)?;
        let mut s = self.lock_progressing();
        let inside =
            s.reservations.range(..=va).next_back().is_some_and(|(&base, &size)| va + g as u64 <= base + size as u64);
        if !inside || s.mappings.contains_key(&va) || !s.live_chunks.contains(&chunk.0) {
            return Err(Self::invalid(
                "cuMemMap",
                format!("va=0x{va:x} chunk={} (outside a reservation, already mapped, or dead chunk)", chunk.0),
            ));
        }
        let offset = (chunk.0 as usize * g) as libc::off_t;
        // SAFETY: va..va+g lies inside a reservation of ours that holds no mapping there.
        let p = unsafe {
            libc::mmap(
                va as *mut libc::c_void,
                g,
                libc::PROT_NONE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                self.memfd.as_raw_fd(),
                offset,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(DeviceError::os("mmap"));
        }
        s.mappings.insert(va, (chunk, false));
        s.mapped_chunks.entry(chunk.0).or_default().push(va);
        Ok(())
    }

    fn set_access(&self, va: DevicePtr, size: usize) -> Result<()> {
        failpoint!(self, "cuMemSetAccess");
        self.check_aligned("cuMemSetAccess", va, size)?;
        let mut s = self.lock_progressing();
        let g = self.gran() as u64;
        if !(va..va + size as u64).step_by(g as usize).all(|a| s.mappings.contains_key(&a)) {
            return Err(Self::invalid("cuMemSetAccess", format!("va=0x{va:x} size={size} is not fully mapped")));
        }
        // SAFETY: the whole range consists of our own memfd mappings.
        if unsafe { libc::mprotect(va as *mut libc::c_void, size, libc::PROT_READ | libc::PROT_WRITE) } != 0 {
            return Err(DeviceError::os("mprotect"));
        }
        for a in (va..va + size as u64).step_by(g as usize) {
            if let Some(m) = s.mappings.get_mut(&a) {
                m.1 = true;
            }
        }
        Ok(())
    }

    fn unmap(&self, va: DevicePtr, size: usize) -> Result<()> {
        failpoint!(self, "cuMemUnmap");
        self.check_aligned("cuMemUnmap", va, size)?;
        let mut s = self.lock_progressing();
        let g = self.gran() as u64;
        if !(va..va + size as u64).step_by(g as usize).all(|a| s.mappings.contains_key(&a)) {
            return Err(Self::invalid("cuMemUnmap", format!("va=0x{va:x} size={size} is not fully mapped")));
        }
        anon_map(size, libc::PROT_NONE, Some(va as usize))?;
        for a in (va..va + size as u64).step_by(g as usize) {
            if let Some((chunk, _)) = s.mappings.remove(&a) {
                let vas = s.mapped_chunks.get_mut(&chunk.0).expect("a mapped chunk has its addresses");
                vas.retain(|&v| v != a);
                if vas.is_empty() {
                    s.mapped_chunks.remove(&chunk.0);
                }
            }
        }
        Ok(())
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
        self.check_device("cuMemcpyHtoDAsync", dst, len)?;
        self.check_pinned("cuMemcpyHtoDAsync", src, len)?;
        let mut s = self.lock_progressing();
        let id = Self::stream_of(&s, "cuMemcpyHtoDAsync", stream)?;
        s.queues.enqueue(id, Work::ToDevice { dst, src, len });
        Ok(())
    }

    unsafe fn copy_to_host_async(&self, dst: HostPtr, src: DevicePtr, len: usize, stream: StreamHandle) -> Result<()> {
        failpoint!(self, "cuMemcpyDtoHAsync");
        self.check_device("cuMemcpyDtoHAsync", src, len)?;
        self.check_pinned("cuMemcpyDtoHAsync", dst, len)?;
        let mut s = self.lock_progressing();
        let id = Self::stream_of(&s, "cuMemcpyDtoHAsync", stream)?;
        s.queues.enqueue(id, Work::ToHost { dst, src, len });
        Ok(())
    }

    fn memset_async(&self, dst: DevicePtr, value: u8, len: usize, stream: StreamHandle) -> Result<()> {
        self.check_device("cuMemsetD8Async", dst, len)?;
        let mut s = self.lock_progressing();
        let id = Self::stream_of(&s, "cuMemsetD8Async", stream)?;
        s.queues.enqueue(id, Work::Memset { dst, value, len });
        Ok(())
    }

    fn fill_pattern_async(
        &self,
        dst: DevicePtr,
        words: usize,
        seed: u64,
        first: u64,
        stream: StreamHandle,
    ) -> Result<()> {
        self.check_device("tiermem_fill", dst, words * 8)?;
        let mut s = self.lock_progressing();
        let id = Self::stream_of(&s, "cuLaunchKernel", stream)?;
        s.queues.enqueue(id, Work::Fill { dst, words, seed, first });
        Ok(())
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
        self.check_device("tiermem_check", src, words * 8)?;
        self.check_device("tiermem_check", counter, 4)?;
        let mut s = self.lock_progressing();
        let id = Self::stream_of(&s, "cuLaunchKernel", stream)?;
        s.queues.enqueue(id, Work::Check { src, words, seed, first, counter });
        Ok(())
    }

    fn write(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        let mut s = self.lock();
        // A synchronous copy runs on the legacy stream, after the work already there.
        Self::run_until(&mut s, "cuMemcpyHtoD", Need::StreamIdle(0))?;
        if !Self::device_range_ok(&s, dst, src.len()) {
            return Err(DeviceError::Fault(format!(
                "cuMemcpyHtoD: device range 0x{dst:x}+{} is not mapped with access",
                src.len()
            )));
        }
        // SAFETY: the destination range was just checked to be mapped with access.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }

    fn read(&self, src: DevicePtr, dst: &mut [u8]) -> Result<()> {
        let mut s = self.lock();
        Self::run_until(&mut s, "cuMemcpyDtoH", Need::StreamIdle(0))?;
        if !Self::device_range_ok(&s, src, dst.len()) {
            return Err(DeviceError::Fault(format!(
                "cuMemcpyDtoH: device range 0x{src:x}+{} is not mapped with access",
                dst.len()
            )));
        }
        // SAFETY: the source range was just checked to be mapped with access.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn alloc_plain(&self, size: usize) -> Result<DevicePtr> {
        let p = anon_map(size, libc::PROT_READ | libc::PROT_WRITE, None)? as DevicePtr;
        self.lock().plain.insert(p, size);
        Ok(p)
    }

    fn free_plain(&self, ptr: DevicePtr) -> Result<()> {
        let size = self
            .lock()
            .plain
            .remove(&ptr)
            .ok_or_else(|| Self::invalid("cuMemFree", format!("0x{ptr:x} is not a plain allocation")))?;
        // SAFETY: our own anonymous mapping, no longer referenced.
        unsafe { libc::munmap(ptr as *mut libc::c_void, size) };
        Ok(())
    }
}
