//! `tiermem tenant-demo` (hidden; for the daemon's tests and for trying tiermemd by hand): an
//! engine linked to the daemon (`TIERMEM_DAEMON`), a working set rewritten and verified round
//! after round while its budget changes under it. `--leak` adds a buffer every round and never
//! frees one; a hog is a working set larger than the GPU. Prints one JSON line at the end and
//! exits non-zero if any byte read back differs from what was written.
//!
//! Reads and writes go a chunk at a time, so any budget of at least one chunk lets the work go
//! on; a budget too small even for that (a tenant that just arrived, before others have given
//! memory back) is waited out: the call is retried, and the retries are counted.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiermem::mechanism::pattern;
use tiermem::{parse_size, AllocOptions, BufferId, Engine, EngineConfig, Error};

#[derive(clap::Args)]
pub struct TenantDemoArgs {
    /// Bytes of buffers rewritten and verified every round.
    #[arg(long, value_parser = parse_size, default_value = "32MiB")]
    working_set: usize,
    /// Size of each buffer.
    #[arg(long, value_parser = parse_size, default_value = "4MiB")]
    buffer_size: usize,
    /// Stop after this many seconds (after the round under way).
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Stop (after the round under way) once this file exists.
    #[arg(long)]
    stop_file: Option<PathBuf>,
    /// While this file exists, wait between rounds touching nothing (an idle tenant).
    #[arg(long)]
    pause_file: Option<PathBuf>,
    /// Allocate one more buffer every round and never free it, up to this many bytes in all.
    #[arg(long, value_parser = parse_size)]
    leak: Option<usize>,
}

/// How long a call is retried while the budget is too small for it.
const PATIENCE: Duration = Duration::from_secs(60);

struct Work {
    engine: Arc<Engine>,
    piece: usize,
    retries: u64,
    verified_bytes: u64,
    scratch: Vec<u8>,
}

impl Work {
    /// Runs `call` until it stops failing for want of HBM (a budget smaller than one chunk).
    fn patiently<T>(&mut self, mut call: impl FnMut(&Engine) -> tiermem::Result<T>) -> Result<T, String> {
        let give_up = Instant::now() + PATIENCE;
        loop {
            match call(&self.engine) {
                Err(Error::WouldNeverFit { .. } | Error::OutOfMemory { .. }) if Instant::now() < give_up => {
                    self.retries += 1;
                    std::thread::sleep(Duration::from_millis(5));
                }
                other => return other.map_err(|e| e.to_string()),
            }
        }
    }

    fn write(&mut self, buffer: BufferId, size: usize, seed: u64) -> Result<(), String> {
        let mut scratch = std::mem::take(&mut self.scratch);
        for offset in (0..size).step_by(self.piece) {
            let piece = &mut scratch[..self.piece.min(size - offset)];
            pattern::fill(seed, offset, piece);
            self.patiently(|e| e.write(buffer, offset, piece))?;
        }
        self.scratch = scratch;
        Ok(())
    }

    fn verify(&mut self, buffer: BufferId, size: usize, seed: u64) -> Result<(), String> {
        let mut scratch = std::mem::take(&mut self.scratch);
        for offset in (0..size).step_by(self.piece) {
            let piece = &mut scratch[..self.piece.min(size - offset)];
            self.patiently(|e| e.read(buffer, offset, piece))?;
            if let Some(at) = pattern::first_mismatch(seed, offset, piece) {
                return Err(format!("tenant-demo: buffer {buffer} differs at byte {at} from what was written"));
            }
            self.verified_bytes += piece.len() as u64;
        }
        self.scratch = scratch;
        Ok(())
    }
}

fn seed(index: usize, generation: u64) -> u64 {
    ((index as u64) << 32) ^ generation.wrapping_mul(0x9E37_79B9) ^ 0x7e4a_47de
}

pub fn run(args: TenantDemoArgs) -> Result<(), String> {
    let engine =
        Arc::new(Engine::new(EngineConfig::from_env().map_err(|e| e.to_string())?).map_err(|e| e.to_string())?);
    let link = tiermem_tenant::attach_from_env(&engine);
    let chunk = engine.chunk_size();
    let size = args.buffer_size.next_multiple_of(chunk);
    let mut work =
        Work { engine: Arc::clone(&engine), piece: chunk, retries: 0, verified_bytes: 0, scratch: vec![0; chunk] };
    // (buffer, generation of the pattern it holds)
    let mut buffers: Vec<(BufferId, u64)> = Vec::new();
    let add_buffer = |work: &mut Work, buffers: &mut Vec<(BufferId, u64)>| -> Result<(), String> {
        let (id, _) = work.engine.alloc(size, AllocOptions::default()).map_err(|e| e.to_string())?;
        work.write(id, size, seed(buffers.len(), 0))?;
        buffers.push((id, 0));
        Ok(())
    };
    for _ in 0..args.working_set.div_ceil(size) {
        add_buffer(&mut work, &mut buffers)?;
    }
    let stop_at = Instant::now() + Duration::from_secs_f64(args.seconds);
    let mut rounds = 0u64;
    // The most chunks seen in the peer tier (neighbours' HBM, lent slabs included) after a round.
    let mut peer_chunks_most = 0usize;
    let exists = |file: &Option<PathBuf>| file.as_ref().is_some_and(|f| f.exists());
    loop {
        while exists(&args.pause_file) && !exists(&args.stop_file) && Instant::now() < stop_at {
            std::thread::sleep(Duration::from_millis(10));
        }
        if rounds > 0 && (exists(&args.stop_file) || Instant::now() >= stop_at) {
            break;
        }
        rounds += 1;
        if args.leak.is_some_and(|limit| (buffers.len() + 1) * size <= limit) {
            add_buffer(&mut work, &mut buffers)?;
        }
        // The working set only: a leaker's extra buffers are left alone until the end.
        for (index, (id, generation)) in buffers.iter_mut().enumerate().take(args.working_set.div_ceil(size)) {
            work.verify(*id, size, seed(index, *generation))?;
            work.write(*id, size, seed(index, *generation + 1))?;
            *generation += 1;
        }
        let in_peer = engine.stats().tiers.get(tiermem::Tier::Peer).map_or(0, |t| t.chunks);
        peer_chunks_most = peer_chunks_most.max(in_peer);
    }
    for (index, &(id, generation)) in buffers.iter().enumerate() {
        work.verify(id, size, seed(index, generation))?;
    }
    let state = link.as_ref().map(|l| l.state()).unwrap_or_default();
    let report = serde_json::json!({
        "rounds": rounds,
        "buffers": buffers.len(),
        "verified_bytes": work.verified_bytes,
        "retries": work.retries,
        "hbm_cap": engine.hbm_cap(),
        "linked": link.is_some(),
        "sessions": state.sessions,
        "budgets_applied": state.budgets_applied,
        "peer_chunks_most": peer_chunks_most,
    });
    println!("{report}");
    for (id, _) in buffers {
        engine.free(id).map_err(|e| e.to_string())?;
    }
    Ok(())
}
