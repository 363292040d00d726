//! `tiermem.Pool`: one engine, its configuration from keyword arguments over the `TIERMEM_*`
//! variables, and its calls. Every call that can block (on the device, the file tier or the
//! engine lock) runs with the GIL released, so other Python threads go on meanwhile.

use crate::buffer::Buffer;
use crate::errors::{to_py, BufferStateError, InvalidArgumentError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tiermem::{parse_size, Access, AllocOptions, Engine, EngineConfig, Region, StreamHandle, Target, Ticket};

/// A tiermem engine on one GPU (or on the simulated device): the `TIERMEM_*` variables,
/// overridden by the arguments given. Sizes are bytes or strings such as `"16GiB"`.
#[pyclass(module = "tiermem", frozen, weakref)]
pub struct Pool {
    pub(crate) engine: Arc<Engine>,
    closed: AtomicBool,
    /// The engine's lease from the node daemon, when one runs (`TIERMEM_DAEMON`).
    _daemon: Option<tiermem_tenant::DaemonLink>,
}

/// A size argument: an int, or a string such as "16GiB".
pub(crate) fn size_arg(name: &str, value: &Bound<'_, PyAny>) -> PyResult<usize> {
    if let Ok(n) = value.extract::<usize>() {
        return Ok(n);
    }
    let text: String = value.extract().map_err(|_| {
        InvalidArgumentError::new_err(format!("{name}: expected bytes as an int or a string like \"16GiB\""))
    })?;
    parse_size(&text).map_err(|e| InvalidArgumentError::new_err(format!("{name}: {e}")))
}

impl Pool {
    /// The engine, unless the Pool is closed.
    fn open(&self, call: &str) -> PyResult<&Engine> {
        match self.closed.load(Ordering::Acquire) {
            true => Err(BufferStateError::new_err(format!("{call}: the Pool is closed"))),
            false => Ok(&self.engine),
        }
    }

    /// Regions from a list of buffers or `(buffer, offset, length)` tuples of this pool.
    fn regions(&self, items: &Bound<'_, PyAny>) -> PyResult<Vec<Region>> {
        let list: Vec<Bound<'_, PyAny>> = match items.downcast::<Buffer>() {
            Ok(_) => vec![items.clone()],
            Err(_) => items.try_iter()?.collect::<PyResult<_>>()?,
        };
        list.iter()
            .map(|item| {
                let (buffer, range) = match item.downcast::<Buffer>() {
                    Ok(b) => (b.clone(), None),
                    Err(_) => {
                        let (b, offset, len): (Bound<'_, Buffer>, usize, usize) = item.extract().map_err(|_| {
                            InvalidArgumentError::new_err("expected a Buffer or a (Buffer, offset, length) tuple")
                        })?;
                        (b, Some((offset, len)))
                    }
                };
                let buffer = buffer.get();
                if !Arc::ptr_eq(&buffer.engine, &self.engine) {
                    return Err(InvalidArgumentError::new_err(format!("buffer {} belongs to another Pool", buffer.id)));
                }
                Ok(match range {
                    None => Region::whole(buffer.id),
                    Some((offset, len)) => Region::bytes(buffer.id, offset, len),
                })
            })
            .collect()
    }

    fn target(&self, buffer: Option<&Bound<'_, Buffer>>) -> PyResult<Target> {
        match buffer {
            None => Ok(Target::All),
            Some(b) => match self.regions(b.as_any())?.as_slice() {
                [region] => Ok(Target::Buffer(region.buffer)),
                _ => unreachable!("one buffer gives one region"),
            },
        }
    }
}

#[pymethods]
impl Pool {
    #[new]
    #[pyo3(signature = (device=None, hbm_limit=None, host_limit=None, policy=None, backend=None, file=None, file_limit=None, chunk=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        device: Option<usize>,
        hbm_limit: Option<&Bound<'_, PyAny>>,
        host_limit: Option<&Bound<'_, PyAny>>,
        policy: Option<&str>,
        backend: Option<&str>,
        file: Option<std::path::PathBuf>,
        file_limit: Option<&Bound<'_, PyAny>>,
        chunk: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let mut config = EngineConfig::from_env().map_err(to_py)?;
        if let Some(device) = device {
            config.device = device;
        }
        if let Some(v) = hbm_limit {
            config.hbm_limit = Some(size_arg("hbm_limit", v)?);
        }
        if let Some(v) = host_limit {
            config.host_limit = Some(size_arg("host_limit", v)?);
        }
        if let Some(p) = policy {
            config.policy = p.parse().map_err(|e| InvalidArgumentError::new_err(format!("policy: {e}")))?;
        }
        if let Some(b) = backend {
            config.backend = b.parse().map_err(|e| InvalidArgumentError::new_err(format!("backend: {e}")))?;
        }
        if let Some(f) = file {
            config.file = Some(f);
        }
        if let Some(v) = file_limit {
            config.file_limit = size_arg("file_limit", v)?;
        }
        if let Some(v) = chunk {
            config.chunk = Some(size_arg("chunk", v)?);
        }
        let engine = Arc::new(py.allow_threads(|| Engine::new(config)).map_err(to_py)?);
        let daemon = py.allow_threads(|| tiermem_tenant::attach_from_env(&engine));
        Ok(Self { engine, closed: AtomicBool::new(false), _daemon: daemon })
    }

    /// "cuda" or "sim".
    #[getter]
    fn backend(&self) -> &'static str {
        match self.engine.device_info().backend {
            tiermem::mechanism::BackendKind::Cuda => "cuda",
            tiermem::mechanism::BackendKind::Sim => "sim",
        }
    }

    /// Why `auto` chose the simulated device, if it did.
    #[getter]
    fn fallback_reason(&self) -> Option<String> {
        self.engine.fallback_reason().map(str::to_owned)
    }

    /// The device ordinal (the CUDA device index on the GPU backend).
    #[getter]
    fn device(&self) -> usize {
        self.engine.device_info().ordinal
    }

    #[getter]
    fn device_name(&self) -> String {
        self.engine.device_info().name.clone()
    }

    #[getter]
    fn hbm_cap(&self) -> usize {
        self.engine.hbm_cap()
    }

    #[getter]
    fn chunk_size(&self) -> usize {
        self.engine.chunk_size()
    }

    #[getter]
    fn policy(&self) -> String {
        self.engine.policy().to_string()
    }

    /// A buffer of `size` bytes; never written chunks read as zeros. `in_place`: reads of it
    /// may be served where its chunks lie in a neighbour GPU's HBM, over NVLink (no copy).
    #[pyo3(signature = (size, priority=0, read_only=false, name=None, in_place=false))]
    fn alloc(
        &self,
        py: Python<'_>,
        size: &Bound<'_, PyAny>,
        priority: i32,
        read_only: bool,
        name: Option<String>,
        in_place: bool,
    ) -> PyResult<Buffer> {
        let size = size_arg("size", size)?;
        let options = AllocOptions { priority, read_only, in_place, name: name.clone() };
        let engine = self.open("alloc")?;
        let (id, ptr) = py.allow_threads(|| engine.alloc(size, options)).map_err(to_py)?;
        Ok(Buffer::new(Arc::clone(&self.engine), id, ptr, size, name))
    }

    /// Buffers of `sizes` bytes at consecutive device addresses, each from a chunk boundary
    /// (`ptr` of one + its size rounded up to the chunk size = `ptr` of the next): a tensor
    /// used a slice at a time, each slice a buffer that moves on its own. Each is freed on
    /// its own; the addresses go back with the last. Named `name[0]`, `name[1]`, ….
    #[pyo3(signature = (sizes, name=None, in_place=false))]
    fn alloc_parts(
        &self,
        py: Python<'_>,
        sizes: Vec<Bound<'_, PyAny>>,
        name: Option<String>,
        in_place: bool,
    ) -> PyResult<Vec<Buffer>> {
        let sizes = sizes.iter().map(|s| size_arg("sizes", s)).collect::<PyResult<Vec<usize>>>()?;
        let options = AllocOptions { in_place, name: name.clone(), ..AllocOptions::default() };
        let engine = self.open("alloc_parts")?;
        let parts = py.allow_threads(|| engine.alloc_parts(&sizes, options)).map_err(to_py)?;
        Ok(parts
            .into_iter()
            .zip(sizes)
            .enumerate()
            .map(|(i, ((id, ptr), size))| {
                let name = name.as_ref().map(|n| format!("{n}[{i}]"));
                Buffer::new(Arc::clone(&self.engine), id, ptr, size, name)
            })
            .collect())
    }

    /// Makes `regions` resident until `release`; `stream` (a CUstream as an int, 0 = the legacy
    /// stream, e.g. `torch.cuda.current_stream().cuda_stream`) waits for them on the device.
    #[pyo3(signature = (regions, stream=0, write=false))]
    fn acquire(&self, py: Python<'_>, regions: &Bound<'_, PyAny>, stream: u64, write: bool) -> PyResult<()> {
        let regions = self.regions(regions)?;
        let access = if write { Access::ReadWrite } else { Access::ReadOnly };
        let engine = self.open("acquire")?;
        py.allow_threads(|| engine.acquire(&regions, access, StreamHandle(stream))).map_err(to_py)
    }

    #[pyo3(signature = (regions, stream=0))]
    fn release(&self, py: Python<'_>, regions: &Bound<'_, PyAny>, stream: u64) -> PyResult<()> {
        let regions = self.regions(regions)?;
        let engine = self.open("release")?;
        py.allow_threads(|| engine.release(&regions, StreamHandle(stream))).map_err(to_py)
    }

    /// `with pool.acquired(regions, stream, write):` acquires on entry and releases on exit.
    #[pyo3(signature = (regions, stream=0, write=false))]
    fn acquired(slf: &Bound<'_, Self>, regions: &Bound<'_, PyAny>, stream: u64, write: bool) -> PyResult<Acquisition> {
        slf.get().regions(regions)?;
        Ok(Acquisition { pool: slf.clone().unbind(), regions: regions.clone().unbind(), stream, write })
    }

    fn prefetch(&self, py: Python<'_>, regions: &Bound<'_, PyAny>) -> PyResult<()> {
        let regions = self.regions(regions)?;
        let engine = self.open("prefetch")?;
        py.allow_threads(|| engine.prefetch(&regions)).map_err(to_py)
    }

    /// Gives up the bytes of the chunks wholly inside `regions`, which the program no longer
    /// wants: their memory is freed with nothing copied, and the next acquire finds them as
    /// zeros without paging anything in. Never waits; a chunk that cannot be dropped at once
    /// keeps its bytes, so the regions' bytes are undefined until written. The regions must
    /// not be acquired. Returns how many chunks gave their memory up.
    fn discard(&self, py: Python<'_>, regions: &Bound<'_, PyAny>) -> PyResult<usize> {
        let regions = self.regions(regions)?;
        let engine = self.open("discard")?;
        py.allow_threads(|| engine.discard(&regions)).map_err(to_py)
    }

    /// Tells the pool the order its buffers are used in: a cycle of steps, each a list of
    /// buffers (e.g. one model layer). Until `clear_schedule`, eviction takes the chunk whose
    /// next use is furthest away (Belady) and `advance` pages ahead along it.
    fn set_schedule(&self, py: Python<'_>, steps: &Bound<'_, PyAny>) -> PyResult<()> {
        let steps: Vec<Vec<tiermem::BufferId>> = steps
            .try_iter()?
            .map(|step| Ok(self.regions(&step?)?.into_iter().map(|r| r.buffer).collect()))
            .collect::<PyResult<_>>()?;
        let engine = self.open("set_schedule")?;
        py.allow_threads(|| engine.set_schedule(steps)).map_err(to_py)
    }

    /// Forgets the schedule, set or recorded: eviction goes back to the policy, and the next
    /// pass (`pass_begins`) is recorded afresh.
    fn clear_schedule(&self, py: Python<'_>) {
        py.allow_threads(|| self.engine.clear_schedule());
    }

    /// Forgets the recorded schedule of the program whose steps include any of `keys` (a model
    /// taken out of a Pool it shares with others), keeping the others' schedules.
    fn forget_steps(&self, py: Python<'_>, keys: Vec<u64>) {
        py.allow_threads(|| self.engine.forget_steps(&keys));
    }

    /// The program is at `step` of the schedule: starts paging in what is missing from this
    /// and the coming steps, `prefetch_bytes` of them. Returns the bytes it started copying.
    fn advance(&self, py: Python<'_>, step: usize, prefetch_bytes: &Bound<'_, PyAny>) -> PyResult<usize> {
        let budget = size_arg("prefetch_bytes", prefetch_bytes)?;
        let engine = self.open("advance")?;
        py.allow_threads(|| engine.advance(step, budget)).map_err(to_py)
    }

    /// A pass of the program begins (a model's forward, say). The first pass after this is
    /// recorded from `step_enters`; when the next pass begins, the recorded steps become the
    /// schedule (as `set_schedule` sets it).
    fn pass_begins(&self, py: Python<'_>) -> PyResult<()> {
        let engine = self.open("pass_begins")?;
        py.allow_threads(|| engine.pass_begins()).map_err(to_py)
    }

    /// The program enters the step `key` (an int, the same for the same step every pass),
    /// which uses `buffers`. While the first pass is recorded this notes the step; once the
    /// schedule is known it finds the step and `advance`s there with `prefetch_bytes`.
    /// Returns the step found, or None (recording, or a step the schedule lacks).
    fn step_enters(
        &self,
        py: Python<'_>,
        key: u64,
        buffers: &Bound<'_, PyAny>,
        prefetch_bytes: &Bound<'_, PyAny>,
    ) -> PyResult<Option<usize>> {
        let ids: Vec<tiermem::BufferId> = self.regions(buffers)?.into_iter().map(|r| r.buffer).collect();
        let budget = size_arg("prefetch_bytes", prefetch_bytes)?;
        let engine = self.open("step_enters")?;
        py.allow_threads(|| engine.step_enters(key, &ids, budget)).map_err(to_py)
    }

    /// The step entered last also uses `buffers`, made while it ran (activations saved for
    /// backward): while the first pass is recorded they join that step, so the schedule pages
    /// them like its own. Afterwards nothing. Returns whether they were recorded.
    fn step_also_uses(&self, py: Python<'_>, buffers: &Bound<'_, PyAny>) -> PyResult<bool> {
        let ids: Vec<tiermem::BufferId> = self.regions(buffers)?.into_iter().map(|r| r.buffer).collect();
        let engine = self.open("step_also_uses")?;
        Ok(py.allow_threads(|| engine.step_also_uses(&ids)))
    }

    /// The keys of the recorded schedules' steps, each schedule's in order, the one in use
    /// first (empty until a pass is recorded).
    #[getter]
    fn recorded_steps(&self, py: Python<'_>) -> Vec<u64> {
        py.allow_threads(|| self.engine.recorded_steps())
    }

    /// Pages `buffer` (default: every buffer) into HBM and waits.
    #[pyo3(signature = (buffer=None))]
    fn page_in(&self, py: Python<'_>, buffer: Option<&Bound<'_, Buffer>>) -> PyResult<()> {
        let target = self.target(buffer)?;
        let engine = self.open("page_in")?;
        py.allow_threads(|| engine.page_in(target)).map_err(to_py)
    }

    /// Pages `buffer` (default: every buffer) out of HBM and waits.
    #[pyo3(signature = (buffer=None))]
    fn page_out(&self, py: Python<'_>, buffer: Option<&Bound<'_, Buffer>>) -> PyResult<()> {
        let target = self.target(buffer)?;
        let engine = self.open("page_out")?;
        py.allow_threads(|| engine.page_out(target)).map_err(to_py)
    }

    /// Pages `buffer` (default: every buffer) out to the file tier and waits.
    #[pyo3(signature = (buffer=None))]
    fn page_out_to_file(&self, py: Python<'_>, buffer: Option<&Bound<'_, Buffer>>) -> PyResult<()> {
        let target = self.target(buffer)?;
        let engine = self.open("page_out_to_file")?;
        py.allow_threads(|| engine.page_out_to_file(target)).map_err(to_py)
    }

    /// Starts paging `buffer` in; returns a ticket for `finish`.
    #[pyo3(signature = (buffer=None))]
    fn page_in_start(&self, py: Python<'_>, buffer: Option<&Bound<'_, Buffer>>) -> PyResult<u64> {
        let (engine, target) = (self.open("page_in_start")?, self.target(buffer)?);
        Ok(py.allow_threads(|| engine.page_in_start(target)).map_err(to_py)?.0)
    }

    /// Starts paging `buffer` out; returns a ticket for `finish`.
    #[pyo3(signature = (buffer=None))]
    fn page_out_start(&self, py: Python<'_>, buffer: Option<&Bound<'_, Buffer>>) -> PyResult<u64> {
        let (engine, target) = (self.open("page_out_start")?, self.target(buffer)?);
        Ok(py.allow_threads(|| engine.page_out_start(target)).map_err(to_py)?.0)
    }

    /// Starts paging `buffer` (default: every buffer) out to the file tier; the file write runs
    /// in the background. Returns a ticket for `finish`.
    #[pyo3(signature = (buffer=None))]
    fn page_out_to_file_start(&self, py: Python<'_>, buffer: Option<&Bound<'_, Buffer>>) -> PyResult<u64> {
        let (engine, target) = (self.open("page_out_to_file_start")?, self.target(buffer)?);
        Ok(py.allow_threads(|| engine.page_out_to_file_start(target)).map_err(to_py)?.0)
    }

    /// Waits for a ticket of `page_in_start`, `page_out_start` or `page_out_to_file_start`.
    fn finish(&self, py: Python<'_>, ticket: u64) -> PyResult<()> {
        let engine = self.open("finish")?;
        py.allow_threads(|| engine.finish(Ticket(ticket))).map_err(to_py)
    }

    /// Pages `outgoing` out and `incoming` in with one schedule, and waits.
    fn exchange(&self, py: Python<'_>, outgoing: &Bound<'_, Buffer>, incoming: &Bound<'_, Buffer>) -> PyResult<()> {
        let (out, inn) = (self.target(Some(outgoing))?, self.target(Some(incoming))?);
        let engine = self.open("exchange")?;
        py.allow_threads(|| engine.exchange(out, inn)).map_err(to_py)
    }

    /// Gives the HBM of idle physical chunks back to the driver, for other users of the GPU
    /// (after `page_out`, that is all of it); returns the bytes given back. Chunks are created
    /// again as buffers come back in.
    fn release_idle_hbm(&self, py: Python<'_>) -> PyResult<usize> {
        let engine = self.open("release_idle_hbm")?;
        py.allow_threads(|| engine.release_idle_hbm()).map_err(to_py)
    }

    /// Changes the HBM budget (`hbm_cap`) to `size` bytes while the Pool runs (whole chunks).
    /// A smaller budget sends the excess down and gives its HBM back as the copies land
    /// (acquired memory stays until released); returns a ticket for `finish`, which waits for
    /// those copies.
    fn set_hbm_budget(&self, py: Python<'_>, size: &Bound<'_, PyAny>) -> PyResult<u64> {
        let (engine, bytes) = (self.open("set_hbm_budget")?, size_arg("size", size)?);
        Ok(py.allow_threads(|| engine.set_hbm_budget(bytes)).map_err(to_py)?.0)
    }

    /// The neighbour GPUs lending HBM to the peer tier, as a list of dicts: `gpu`, `lent` (bytes
    /// it lends now), `borrowed` (bytes borrowed from it now) and `busy` (its own kernels run,
    /// so its traffic is held to `TIERMEM_PEER_BUSY_RATE`). Empty without a peer tier;
    /// `peer_notes` says why.
    fn peer_lenders<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let engine = self.open("peer_lenders")?;
        let busy = engine.busy_lenders();
        engine
            .peer_lenders()
            .into_iter()
            .map(|(gpu, lent, borrowed)| {
                let d = PyDict::new(py);
                d.set_item("gpu", gpu)?;
                d.set_item("lent", lent)?;
                d.set_item("borrowed", borrowed)?;
                d.set_item("busy", busy.contains(&gpu))?;
                Ok(d)
            })
            .collect()
    }

    /// Why GPUs of this machine do not lend to the peer tier, or do not copy page-ins for this
    /// one (two links), one line each.
    #[getter]
    fn peer_notes(&self) -> PyResult<Vec<String>> {
        Ok(self.open("peer_notes")?.peer_notes().to_vec())
    }

    /// GPU `gpu` lends at most `size` bytes from now on (0: give everything back now); what
    /// exceeds it moves before this returns, losing nothing. Returns the bytes given back.
    fn set_peer_lending(&self, py: Python<'_>, gpu: usize, size: &Bound<'_, PyAny>) -> PyResult<usize> {
        let (engine, bytes) = (self.open("set_peer_lending")?, size_arg("size", size)?);
        py.allow_threads(|| engine.set_peer_lending(gpu, bytes)).map_err(to_py)
    }

    /// Copies up to `chunks` chunks whose only copy is on a lender to free host room, so that
    /// the lender can take its memory back without a copy (done in the background too, while
    /// `TIERMEM_PEER_CLEAN` is on). Returns how many.
    #[pyo3(signature = (chunks=16))]
    fn clean_borrowed(&self, py: Python<'_>, chunks: usize) -> PyResult<usize> {
        let engine = self.open("clean_borrowed")?;
        py.allow_threads(|| engine.clean_borrowed(chunks)).map_err(to_py)
    }

    /// Closes the Pool: every later call through it is refused (`BufferStateError`). Its
    /// memory goes back once the Pool and its Buffers have been collected (each Buffer keeps
    /// the engine alive). Closing twice is harmless.
    fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    #[getter]
    fn closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Tiers, transfer counters and per-buffer residency, as a dict: the engine's `Stats`
    /// serialized, with `bytes_in` and `bytes_out` among the `transfers`.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let mut stats = serde_json::to_value(self.engine.stats())
            .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(format!("stats: {e}")))?;
        if let Some(top) = stats.as_object_mut() {
            let moved: Vec<_> = ["bytes_in", "bytes_out"].iter().filter_map(|k| top.remove_entry(*k)).collect();
            if let Some(transfers) = top.get_mut("transfers").and_then(|t| t.as_object_mut()) {
                transfers.extend(moved);
            }
        }
        py.import("json")?.call_method1("loads", (stats.to_string(),))
    }

    fn __repr__(&self) -> String {
        format!(
            "<tiermem.Pool {} on {} ({}), HBM cap {} bytes>",
            self.policy(),
            self.device_name(),
            self.backend(),
            self.hbm_cap()
        )
    }
}

/// What `Pool.acquired` returns: acquires on `__enter__`, releases on `__exit__`.
#[pyclass(module = "tiermem", frozen)]
pub struct Acquisition {
    pool: Py<Pool>,
    regions: PyObject,
    stream: u64,
    write: bool,
}

#[pymethods]
impl Acquisition {
    fn __enter__(&self, py: Python<'_>) -> PyResult<()> {
        self.pool.get().acquire(py, self.regions.bind(py), self.stream, self.write)
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.pool.get().release(py, self.regions.bind(py), self.stream)?;
        Ok(false)
    }
}
