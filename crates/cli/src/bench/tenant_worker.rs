//! One tenant of `tiermem bench tenants`, run as a process of its own (`tiermem bench
//! tenant-worker`, hidden): an engine set up from `TIERMEM_*` (standalone with its cap, or
//! linked to tiermemd by `TIERMEM_DAEMON`), a working set of buffers, and rounds of GPU work
//! over it: per buffer, acquire it, check on the GPU the pattern the last round wrote, write a
//! new one, release it. Every byte is checked by a kernel every round, so a tenant that
//! finishes with no mismatch lost nothing while its budget moved. Prints one JSON line.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiermem::mechanism::{DevicePtr, StreamHandle, StreamPriority};
use tiermem::{Access, AllocOptions, BufferId, Engine, EngineConfig, Error, Region};

#[derive(clap::Args)]
pub struct WorkerArgs {
    /// Bytes of buffers worked on every round.
    #[arg(long, value_parser = tiermem::parse_size)]
    pub working_set: usize,
    /// Size of each buffer.
    #[arg(long, value_parser = tiermem::parse_size, default_value = "128MiB")]
    pub buffer_size: usize,
    /// Rounds to run (0: until --stop-file exists).
    #[arg(long, default_value_t = 0)]
    pub rounds: u64,
    /// Stop after the round under way once this file exists.
    #[arg(long)]
    pub stop_file: Option<PathBuf>,
    /// Allocate one more buffer every round and never free one, up to this many bytes in all.
    #[arg(long, value_parser = tiermem::parse_size)]
    pub leak: Option<usize>,
    /// Host time, in milliseconds, spent before each buffer's turn (the host-side work of a
    /// real job between its kernels: preparing inputs, answering a request), during which the
    /// job leaves the GPU to others.
    #[arg(long, default_value_t = 0.0)]
    pub think_ms: f64,
    /// After this many rounds, acquire nothing more (an idle tenant) until --stop-file exists.
    #[arg(long)]
    pub idle_after_rounds: Option<u64>,
    /// Also hold this much GPU memory outside tiermem (a plain allocation, written once), as a
    /// program's own allocations or a library's workspace would: its process's overhead.
    #[arg(long, value_parser = tiermem::parse_size)]
    pub outside: Option<usize>,
}

/// The columns of a round's end in the trace ([`round_end`]).
pub(super) const ROUND_COLUMNS: [&str; 9] =
    ["s", "hbm_budget", "paged_in", "stall_ms", "evict_wait_ms", "map_ms", "unmap_ms", "pin_ms", "host_pinned"];

/// What a round's end saw, as [`ROUND_COLUMNS`] name it: the seconds since the work began, the
/// HBM budget, and the running totals of bytes paged in, of the milliseconds acquires waited for
/// page-ins (`stall`) and for evictions, of the driver's milliseconds making and mapping HBM
/// chunks (`cuMemCreate`, `cuMemMap`, `cuMemSetAccess`), unmapping and releasing them, and
/// pinning host memory, then the pinned host bytes held. The differences between two rounds
/// say where a slow one's time went.
fn round_end(engine: &Engine, since: Instant) -> serde_json::Value {
    let (stats, driver) = (engine.stats(), engine.driver_times());
    serde_json::json!([
        since.elapsed().as_secs_f64(),
        engine.hbm_cap(),
        stats.bytes_in,
        stats.transfers.stall_ms,
        stats.transfers.evict_wait_ms,
        driver.create_chunk.ms + driver.map.ms + driver.set_access.ms,
        driver.unmap.ms + driver.release_chunk.ms,
        driver.alloc_pinned.ms,
        stats.host_pinned_bytes,
    ])
}

/// How long an acquire is retried while the budget is too small for it (a tenant that just
/// arrived, before the others have given memory back).
const PATIENCE: Duration = Duration::from_secs(120);

struct Worker {
    engine: Arc<Engine>,
    stream: StreamHandle,
    counter: DevicePtr,
    size: usize,
    retries: u64,
}

impl Worker {
    /// One buffer's turn: acquire, check `previous` (if any), write `next`, release.
    fn touch(&mut self, (id, va): (BufferId, u64), previous: Option<u64>, next: u64) -> Result<(), String> {
        let region = [Region::whole(id)];
        let give_up = Instant::now() + PATIENCE;
        loop {
            match self.engine.acquire(&region, Access::ReadWrite, self.stream) {
                Ok(()) => break,
                Err(Error::OutOfMemory { .. } | Error::WouldNeverFit { .. }) if Instant::now() < give_up => {
                    self.retries += 1;
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        let device = self.engine.device();
        let words = self.size / 8;
        let launched = previous
            .map_or(Ok(()), |seed| device.check_pattern_async(va, words, seed, 0, self.counter, self.stream))
            .and_then(|()| device.fill_pattern_async(va, words, next, 0, self.stream));
        let released = self.engine.release(&region, self.stream).map_err(|e| e.to_string());
        launched.map_err(|e| e.to_string())?;
        released
    }

    /// A new buffer, written with its first pattern: `(id, address, rounds written)`.
    fn add_buffer(&mut self, buffers: &mut Vec<(BufferId, u64, u64)>) -> Result<(), String> {
        let (id, va) = self.engine.alloc(self.size, AllocOptions::default()).map_err(|e| e.to_string())?;
        self.touch((id, va), None, seed(buffers.len(), 0))?;
        buffers.push((id, va, 0));
        Ok(())
    }
}

fn seed(index: usize, round: u64) -> u64 {
    ((index as u64) << 32) ^ round.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x7e4a_47de
}

pub fn run(args: WorkerArgs) -> Result<(), String> {
    let started = Instant::now();
    let engine =
        Arc::new(Engine::new(EngineConfig::from_env().map_err(|e| e.to_string())?).map_err(|e| e.to_string())?);
    let link = tiermem_tenant::attach_from_env(&engine);
    let device = Arc::clone(engine.device());
    let stream = device.create_stream(StreamPriority::High).map_err(|e| e.to_string())?;
    let counter = device.alloc_plain(4).map_err(|e| e.to_string())?;
    device.write(counter, &[0; 4]).map_err(|e| e.to_string())?;
    let outside = match args.outside {
        Some(bytes) if bytes > 0 => {
            let ptr = device.alloc_plain(bytes).map_err(|e| format!("tenant-worker: --outside {bytes}: {e}"))?;
            // Written, so that the driver backs every page of it.
            let launched = device.fill_pattern_async(ptr, bytes / 8, 1, 0, stream);
            launched.and_then(|()| device.synchronize_stream(stream)).map_err(|e| e.to_string())?;
            Some(ptr)
        }
        _ => None,
    };
    let size = args.buffer_size.next_multiple_of(engine.chunk_size());
    let mut worker = Worker { engine: Arc::clone(&engine), stream, counter, size, retries: 0 };
    let mut buffers = Vec::new();
    for _ in 0..args.working_set.div_ceil(size) {
        worker.add_buffer(&mut buffers)?;
    }
    let working = Instant::now();
    let (mut rounds, mut bytes) = (0u64, 0u64);
    let mut trace = Vec::new();
    loop {
        let stop = args.stop_file.as_ref().is_some_and(|f| f.exists());
        if (args.rounds > 0 && rounds >= args.rounds) || (args.rounds == 0 && stop) {
            break;
        }
        if args.idle_after_rounds.is_some_and(|idle| rounds >= idle) {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        if args.leak.is_some_and(|limit| (buffers.len() + 1) * size <= limit) {
            worker.add_buffer(&mut buffers)?;
        }
        rounds += 1;
        for (i, (id, va, written)) in buffers.iter_mut().enumerate() {
            if args.think_ms > 0.0 {
                std::thread::sleep(Duration::from_secs_f64(args.think_ms / 1e3));
            }
            worker.touch((*id, *va), Some(seed(i, *written)), seed(i, *written + 1))?;
            *written += 1;
            bytes += size as u64;
        }
        trace.push(round_end(&engine, working));
    }
    let mut count = [0u8; 4];
    device.synchronize_stream(stream).and_then(|()| device.read(counter, &mut count)).map_err(|e| e.to_string())?;
    let seconds = working.elapsed().as_secs_f64();
    let mismatches = u32::from_le_bytes(count);
    let stats = engine.stats();
    let line = serde_json::json!({
        "rounds": rounds,
        "bytes": bytes,
        "seconds": seconds,
        "total_seconds": started.elapsed().as_secs_f64(),
        "mismatched_words": mismatches,
        "buffers": buffers.len(),
        "retries": worker.retries,
        "linked": link.is_some(),
        "hbm_cap": engine.hbm_cap(),
        "paged_in_bytes": stats.bytes_in,
        "paged_out_bytes": stats.bytes_out,
        "page_ins": stats.transfers.page_ins,
        "prefetched": stats.transfers.prefetched,
        "stall_ms": stats.transfers.stall_ms,
        "evict_wait_ms": stats.transfers.evict_wait_ms,
        "rounds_trace": trace,
    });
    println!("{line}");
    // Ended before the process exits: a budget arriving as the driver shuts down is not an error.
    if let Some(link) = link {
        link.end();
    }
    for (id, _, _) in buffers {
        engine.free(id).map_err(|e| e.to_string())?;
    }
    if let Some(ptr) = outside {
        device.free_plain(ptr).map_err(|e| e.to_string())?;
    }
    device.free_plain(counter).and_then(|()| device.destroy_stream(stream)).map_err(|e| e.to_string())?;
    match mismatches {
        0 => Ok(()),
        n => Err(format!("tenant-worker: {n} words differed from what was written")),
    }
}
