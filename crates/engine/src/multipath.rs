//! Two links into the GPU (memHarvester §4.3.1; GLake's multi-path copies): a page-in from
//! host memory also comes in through each lender's PCIe link.
//!
//! A copy from host memory is run by a copy engine and crosses the PCIe link of that engine's
//! GPU: ~55 GB/s on an H200, the limit of every page-in from the host tier. A neighbour that
//! lends HBM to the peer tier is idle, and so is its link; its copy engine can copy from host
//! memory straight into this GPU's HBM, over NVLink (~394 GB/s, so its PCIe link stays the
//! limit): a second path as fast as the first. Each lender therefore gets a *helper*: the lender
//! opened as a device of its own (its CUDA context), one stream there and one event. Buffers'
//! chunks are mapped with access from the helpers' GPUs as well as this one (copy_up), and a
//! page-in's runs from the host tier are divided between the paths by
//! `policy::split_between_paths`: this GPU's part on the page-in's stream as before, each
//! helper's part on the helper's stream.
//!
//! **Ordering across two GPUs.** Before its first copy of a page-in, a helper's stream waits
//! for everything already queued on the page-in's stream (`fork`: one event of this GPU,
//! recorded there). After the page-in's last batch, the page-in's stream waits for the
//! helpers' copies (`join`: each helper's event, recorded on its stream), and only then is the
//! chunks' `ready` fence recorded: whoever waits for the fence waits for every path. One event
//! each way suffices: a wait takes the event's latest record when it is queued, and record and
//! wait are queued together, under the engine's lock.
//!
//! **When.** A helper is used while its GPU lends to the peer tier: the lender watch lowers a
//! lender on which another program starts to nothing, and the helper stops with it — "throttled
//! when the neighbour is busy", at the lender watch's granularity. `TIERMEM_MULTIPATH=off`
//! never opens one (each costs a CUDA context on its lender).

use std::sync::Arc;
use tiermem_mechanism::{Device, DevicePtr, EventHandle, HostPtr, Result, StreamHandle, StreamPriority};

/// A part smaller than this many chunks goes on one path: a second path costs an event and a
/// wait each way (a few µs), a chunk's copy ~38 µs.
pub const LEAST_CHUNKS_PER_PATH: usize = 4;

/// A lender's copy engine, driven through a context of its own.
struct Helper {
    gpu: usize,
    device: Arc<dyn Device>,
    stream: StreamHandle,
    /// Recorded after its copies of a page-in; the page-in's stream waits for it.
    done: EventHandle,
    /// Whether its stream waits for the current page-in's stream already.
    forked: bool,
}

/// The helpers of every lender, and the event that forks work to them.
pub(crate) struct Multipath {
    helpers: Vec<Helper>,
    /// On this GPU: recorded on a page-in's stream before its first helper copy.
    fork: Option<EventHandle>,
    /// The GPUs that need access to buffers' chunks: this one, then each helper's.
    access: Vec<usize>,
}

impl Multipath {
    /// No second path: page-ins use this GPU's link alone.
    pub fn none(me: usize) -> Self {
        Self { helpers: Vec::new(), fork: None, access: vec![me] }
    }

    /// Opens a helper on each of `gpus`. A GPU that cannot be opened, or whose stream or event
    /// cannot be made, gets none: returned as a note saying why.
    pub fn open(device: &dyn Device, gpus: &[usize]) -> (Self, Vec<String>) {
        let mut paths = Self::none(device.info().ordinal);
        let mut notes = Vec::new();
        if gpus.is_empty() {
            return (paths, notes);
        }
        paths.fork = match device.create_event(false) {
            Ok(event) => Some(event),
            Err(e) => return (paths, vec![format!("multipath: no event on this GPU: {e}")]),
        };
        for &gpu in gpus {
            match Self::helper(device, gpu) {
                Ok(helper) => {
                    paths.access.push(gpu);
                    paths.helpers.push(helper);
                }
                Err(e) => notes.push(format!("multipath: GPU {gpu} does not copy for this one: {e}")),
            }
        }
        (paths, notes)
    }

    fn helper(device: &dyn Device, gpu: usize) -> Result<Helper> {
        let helper = device.neighbour(gpu)?;
        let me = device.info().ordinal;
        if !helper.peer_access(me) {
            // Its copy engine could not write here: and granting it access would fail every map.
            return Err(tiermem_mechanism::DeviceError::Unsupported(format!("it has no peer access to GPU {me}")));
        }
        let stream = helper.create_stream(StreamPriority::High)?;
        let done = match helper.create_event(false) {
            Ok(done) => done,
            Err(e) => {
                let _ = helper.destroy_stream(stream);
                return Err(e);
            }
        };
        Ok(Helper { gpu, device: helper, stream, done, forked: false })
    }

    /// The GPUs that need access to buffers' chunks (this one first).
    pub fn access(&self) -> &[usize] {
        &self.access
    }

    /// The helpers usable now (`lends(gpu)`: whether that GPU lends now), by index.
    pub fn usable(&self, lends: impl Fn(usize) -> bool) -> Vec<usize> {
        (0..self.helpers.len()).filter(|&i| lends(self.helpers[i].gpu)).collect()
    }

    /// Copies `len` bytes of pinned host memory at `src` to `dst` (mapped with access from
    /// every GPU of [`Multipath::access`]) on helper `i`'s stream, after everything queued on
    /// `stream` so far.
    ///
    /// # Safety
    /// As `Device::copy_to_device_async`: `src` stays valid and unchanged until the copy is
    /// done, which `stream` knows after [`Multipath::join`].
    pub unsafe fn copy(
        &mut self,
        device: &dyn Device,
        i: usize,
        dst: DevicePtr,
        src: HostPtr,
        len: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        let fork = self.fork.expect("helpers exist only with a fork event");
        let helper = &mut self.helpers[i];
        if !helper.forked {
            device.record_event(fork, stream)?;
            helper.device.stream_wait_event(helper.stream, fork)?;
            helper.forked = true;
        }
        // SAFETY: the caller's guarantees, passed on; the helper's GPU has access to `dst`.
        unsafe { helper.device.copy_to_device_async(dst, src, len, helper.stream) }
    }

    /// Makes `stream` wait for every helper copy since the last join. If that cannot be
    /// queued, waits for them here instead.
    pub fn join(&mut self, device: &dyn Device, stream: StreamHandle) -> Result<()> {
        for helper in self.helpers.iter_mut().filter(|h| h.forked) {
            helper.forked = false;
            let queued = helper.device.record_event(helper.done, helper.stream);
            if queued.and_then(|()| device.stream_wait_event(stream, helper.done)).is_err() {
                helper.device.synchronize_stream(helper.stream)?;
            }
        }
        Ok(())
    }

    /// Waits, on the host, for every helper copy queued (a page-in that failed half way: its
    /// chunks go back to the pool, and no copy may land in them later).
    pub fn synchronize(&self) -> Result<()> {
        self.helpers.iter().try_for_each(|h| h.device.synchronize_stream(h.stream))
    }

    /// Waits for the helpers and gives their streams, events and contexts back (shutdown).
    pub fn release(&mut self, device: &dyn Device) -> Result<()> {
        let mut outcome = Ok(());
        for helper in self.helpers.drain(..) {
            outcome = outcome
                .and(helper.device.synchronize_stream(helper.stream))
                .and(helper.device.destroy_event(helper.done))
                .and(helper.device.destroy_stream(helper.stream));
        }
        if let Some(fork) = self.fork.take() {
            outcome = outcome.and(device.destroy_event(fork));
        }
        self.access.truncate(1);
        outcome
    }
}
