//! `tiermem lend --gpu N`: lends a GPU's spare HBM to tiermem tenants on the other GPUs of the
//! node, through the node daemon. It holds a CUDA context on that GPU and nothing else until
//! the daemon asks for slabs; each slab is made shareable (`cuMemCreate` with a POSIX file
//! descriptor handle type), exported and sent to the daemon beside the `slabs` message, which
//! passes it on to the borrower (`SCM_RIGHTS`). The lender keeps its handle until the daemon
//! says the borrower has let go (`release`).
//!
//! It watches its own GPU: when free memory falls below `--reserve` (another program needs the
//! GPU), it lowers its offer by the difference and the daemon asks borrowers to return slabs
//! (escalating against one that does not, docs/daemon.md). When the daemon goes away it
//! releases every handle (memory still mapped by a borrower lives until that borrower lets
//! go; a borrower gives such slabs back when it reconnects) and connects again.

use clap::Args;
use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tiermem::mechanism::{self, ChunkLocation, Device, PhysHandle};
use tiermem::{format_size, parse_size, EngineConfig};
use tiermem_protocol::{ClientMessage, DaemonMessage, GpuId};
use tiermem_tenant::Connection;

#[derive(Args)]
pub struct LendArgs {
    /// The GPU whose HBM is lent (CUDA ordinal).
    #[arg(long)]
    gpu: usize,
    /// The most it lends, all borrowers together (default: its free memory less the reserve).
    #[arg(long, value_parser = parse_size)]
    offer: Option<usize>,
    /// HBM kept free on the GPU for its own programs: below it, lent memory is asked back.
    #[arg(long, value_parser = parse_size, default_value = "4GiB")]
    reserve: usize,
    /// The daemon's socket (default: TIERMEM_SOCKET, or where `tiermem daemon` listens by default).
    #[arg(long)]
    socket: Option<PathBuf>,
}

/// How often the lender looks at its GPU's free memory.
const WATCH_EVERY: Duration = Duration::from_millis(200);

pub fn run(args: LendArgs) -> Result<(), String> {
    let socket = crate::node::socket_of_daemon(args.socket.clone()).map_err(|e| format!("lend: {e}"))?;
    let config = EngineConfig::from_env().map_err(|e| e.to_string())?;
    let sim = mechanism::SimNode { gpus: config.sim_gpus.max(args.gpu + 1), hbm_per_gpu: config.sim_hbm };
    let (device, fallback) =
        mechanism::open_in_node(config.backend, args.gpu, sim).map_err(|e| format!("lend: {e}"))?;
    if let Some(why) = fallback {
        eprintln!("tiermem lend: no GPU usable ({why}): lending the simulated device's memory");
    }
    let (free, _) = device.mem_info().map_err(|e| format!("lend: {e}"))?;
    let most = args.offer.unwrap_or(free.saturating_sub(args.reserve));
    eprintln!(
        "tiermem lend: GPU {} lends up to {} ({} free, {} kept) through {}",
        args.gpu,
        format_size(most),
        format_size(free),
        format_size(args.reserve),
        socket.display()
    );
    let mut lender = Lender { device, gpu: args.gpu, reserve: args.reserve, most, slabs: HashMap::new() };
    let mut backoff = Duration::from_millis(100);
    loop {
        let outcome = lender.session(&socket);
        lender.release_all();
        match outcome {
            Ok(()) => return Ok(()),
            Err(e) => eprintln!("tiermem lend: {e}; connecting again"),
        }
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

struct Lender {
    device: std::sync::Arc<dyn Device>,
    gpu: usize,
    reserve: usize,
    most: usize,
    /// Slabs made and not yet released, by the daemon's id.
    slabs: HashMap<u64, (PhysHandle, usize)>,
}

impl Lender {
    fn lent(&self) -> usize {
        self.slabs.values().map(|&(_, bytes)| bytes).sum()
    }

    /// What it offers now: at most `most`, less what its GPU is short of the reserve.
    fn offer(&self) -> usize {
        match self.device.mem_info() {
            Ok((free, _)) => tiermem::lending_recap(self.lent(), free, self.reserve, self.most),
            Err(_) => self.most,
        }
    }

    fn session(&mut self, socket: &std::path::Path) -> Result<(), String> {
        let mut connection =
            Connection::open(socket, concat!("tiermem lend ", env!("CARGO_PKG_VERSION"))).map_err(|e| e.to_string())?;
        let info = self.device.info();
        let gpu = GpuId {
            index: self.gpu as u32,
            uuid: info.uuid.clone(),
            total_bytes: info.total_bytes as u64,
            simulated: info.backend == mechanism::BackendKind::Sim,
        };
        let mut offered = self.offer();
        let lend = ClientMessage::Lend { pid: std::process::id(), gpu, offer_bytes: offered as u64 };
        connection.send(&lend).map_err(|e| e.to_string())?;
        match connection.wait().map_err(|e| e.to_string())? {
            DaemonMessage::Registered { tenant, .. } => eprintln!("tiermem lend: lender {tenant}"),
            DaemonMessage::Error { message, .. } => return Err(format!("the daemon refused: {message}")),
            other => return Err(format!("the daemon sent {} out of turn", other.kind())),
        }
        let mut next_watch = Instant::now() + WATCH_EVERY;
        loop {
            if Instant::now() >= next_watch {
                let offer = self.offer();
                if offer != offered {
                    eprintln!("tiermem lend: offering {} (was {})", format_size(offer), format_size(offered));
                    connection.send(&ClientMessage::Offer { bytes: offer as u64 }).map_err(|e| e.to_string())?;
                    offered = offer;
                }
                next_watch = Instant::now() + WATCH_EVERY;
            }
            match connection.poll().map_err(|e| e.to_string())? {
                Some(DaemonMessage::MakeSlabs { ids, slab_bytes }) => {
                    let (message, fds) = self.make(&ids, slab_bytes as usize);
                    let fds: Vec<_> = fds.iter().map(|fd| fd.as_fd()).collect();
                    connection.send_with_fds(&message, &fds).map_err(|e| e.to_string())?;
                }
                Some(DaemonMessage::Release { ids }) => {
                    for id in ids {
                        if let Some((handle, _)) = self.slabs.remove(&id) {
                            if let Err(e) = self.device.release_chunk(handle) {
                                eprintln!("tiermem lend: releasing slab {id}: {e}");
                            }
                        }
                    }
                }
                Some(DaemonMessage::Error { message, .. }) => return Err(format!("the daemon closed: {message}")),
                Some(_) | None => {}
            }
        }
    }

    /// Makes and exports the slabs `ids`: the `slabs` answer and the descriptors to send with it.
    fn make(&mut self, ids: &[u64], bytes: usize) -> (ClientMessage, Vec<OwnedFd>) {
        let granularity = self.device.info().granularity;
        let (mut made, mut failed, mut fds, mut error) = (Vec::new(), Vec::new(), Vec::new(), None);
        for &id in ids {
            let exported = match bytes % granularity {
                0 if bytes > 0 => self.export(bytes / granularity),
                _ => Err(format!("a slab of {bytes} bytes is not whole granules of {granularity}")),
            };
            match exported {
                Ok((handle, fd)) => {
                    self.slabs.insert(id, (handle, bytes));
                    made.push(id);
                    fds.push(fd);
                }
                Err(why) => {
                    failed.push(id);
                    error = Some(why);
                }
            }
        }
        if let Some(why) = &error {
            eprintln!("tiermem lend: {} slab(s) not made: {why}", failed.len());
        }
        (ClientMessage::Slabs { ids: made, failed, error }, fds)
    }

    fn export(&self, granules: usize) -> Result<(PhysHandle, OwnedFd), String> {
        let handle = self
            .device
            .create_shareable_chunks_at(ChunkLocation::Gpu(self.gpu), granules)
            .map_err(|e| e.to_string())?;
        match self.device.export_chunk(handle) {
            Ok(fd) => Ok((handle, fd)),
            Err(e) => {
                let _ = self.device.release_chunk(handle);
                Err(e.to_string())
            }
        }
    }

    /// Releases every handle (the daemon went away: it knows none of these any more).
    fn release_all(&mut self) {
        for (id, (handle, _)) in self.slabs.drain() {
            if let Err(e) = self.device.release_chunk(handle) {
                eprintln!("tiermem lend: releasing slab {id}: {e}");
            }
        }
    }
}
