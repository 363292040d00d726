//! The link's thread: register, report, apply budgets; reconnect when the daemon goes away.
//!
//! One thread per engine. It holds the engine only weakly (a strong reference for one loop
//! iteration at a time), so dropping the engine's last owner ends the link. A budget is
//! applied here, on this thread: `set_hbm_budget` starts sending the excess down and `finish`
//! waits until the smaller budget is met; only then is it acknowledged (`budget_met`). While
//! the daemon is away the engine keeps the budget it has, and the thread tries again with a
//! growing pause (up to [`MAX_BACKOFF`]).

use crate::client::Connection;
use crate::Leaseholder;
use crate::{LinkError, LinkState};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};
use tiermem::Stats;
use tiermem_protocol::{ClientMessage, DaemonMessage, GpuId, Tier, TierBytes, TierUsage, TransferCounters};

/// The longest pause between two attempts to reach the daemon.
pub const MAX_BACKOFF: Duration = Duration::from_secs(1);

pub(crate) struct Shared {
    pub state: Mutex<LinkState>,
    pub changed: Condvar,
    pub stop: AtomicBool,
}

impl Shared {
    pub fn update(&self, change: impl FnOnce(&mut LinkState)) {
        change(&mut self.state.lock().unwrap_or_else(|p| p.into_inner()));
        self.changed.notify_all();
    }
}

pub(crate) struct Options {
    pub socket: PathBuf,
    pub label: Option<String>,
    pub report_every: Duration,
    /// The engine's HBM cap before any budget: what it would use alone.
    pub wants_hbm: u64,
}

/// Runs until `shared.stop` is set or the engine is gone.
pub(crate) fn run(engine: Weak<dyn Leaseholder>, shared: Arc<Shared>, options: Options) {
    let mut backoff = Duration::from_millis(50);
    let mut last_error: Option<String> = None;
    while !shared.stop.load(Ordering::Acquire) {
        match session(&engine, &shared, &options) {
            Ok(()) => return,
            Err(error) => {
                let was_connected = shared.state.lock().map(|s| s.connected).unwrap_or(false);
                shared.update(|s| {
                    s.connected = false;
                    s.failed_attempts += 1;
                });
                let text = error.to_string();
                if was_connected || last_error.as_deref() != Some(text.as_str()) {
                    eprintln!("tiermem: daemon link: {text}; keeping the current budget, trying again");
                }
                last_error = Some(text);
                if was_connected {
                    backoff = Duration::from_millis(50);
                }
            }
        }
        let until = Instant::now() + backoff;
        while Instant::now() < until && !shared.stop.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(10));
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// One connection's life: `Ok` when the link should end (stopped, engine gone).
fn session(weak: &Weak<dyn Leaseholder>, shared: &Shared, options: &Options) -> Result<(), LinkError> {
    let mut connection = Connection::open(&options.socket, concat!("tiermem ", env!("CARGO_PKG_VERSION")))?;
    // What the lenders offered at the engine's start: fixed for its life.
    let peer_offered = match weak.upgrade() {
        Some(holder) => holder.engine().peer_offered() as u64,
        None => return Ok(()),
    };
    let register = {
        let Some(holder) = weak.upgrade() else { return Ok(()) };
        let engine = holder.engine();
        // Slabs lent in an earlier session have ids this daemon (maybe a restarted one) does
        // not know: give them back, and be lent afresh.
        if let Err(e) = engine.return_lent_slabs(&engine.lent_slabs()) {
            eprintln!("tiermem: daemon link: giving back slabs lent before: {e}");
        }
        let info = engine.device_info();
        ClientMessage::Register {
            pid: std::process::id(),
            label: options.label.clone(),
            gpu: GpuId {
                index: info.ordinal as u32,
                uuid: info.uuid.clone(),
                total_bytes: info.total_bytes as u64,
                simulated: info.backend == tiermem::mechanism::BackendKind::Sim,
            },
            chunk_bytes: engine.chunk_size() as u64,
            wants: vec![
                TierBytes { tier: Tier::Hbm, bytes: options.wants_hbm },
                TierBytes { tier: Tier::Peer, bytes: peer_offered },
            ],
            held: vec![TierBytes { tier: Tier::Hbm, bytes: engine.stats().tiers[Tier::Hbm].used_bytes as u64 }],
            lent_slab_bytes: borrows_lent(engine).then(|| engine.peer_slab_bytes() as u64),
        }
    };
    connection.send(&register)?;
    let DaemonMessage::Registered { tenant, .. } = connection.wait()? else {
        return Err(LinkError::Unexpected("a reply other than registered"));
    };
    shared.update(|s| {
        s.connected = true;
        s.tenant = Some(tenant);
        s.sessions += 1;
    });
    let accepts_lent = match weak.upgrade() {
        Some(holder) => borrows_lent(holder.engine()),
        None => return Ok(()),
    };
    let mut last_report: Option<([TierUsage; 4], TransferCounters)> = None;
    let mut next_report = Instant::now();
    loop {
        if shared.stop.load(Ordering::Acquire) {
            return Ok(());
        }
        let Some(holder) = weak.upgrade() else { return Ok(()) };
        if Instant::now() >= next_report {
            let stats = holder.engine().stats();
            let report = (usage_of(&stats, peer_offered, accepts_lent), transfers_of(&stats));
            if last_report != Some(report) {
                let ([hbm, peer, host, file], transfers) = report;
                connection.send(&ClientMessage::Usage { hbm, host, file, peer, transfers })?;
                last_report = Some(report);
            }
            next_report = Instant::now() + options.report_every;
            let returned = holder.engine().returned_lent_slabs();
            if !returned.is_empty() {
                connection.send(&ClientMessage::Returned { ids: returned })?;
            }
        }
        drop(holder);
        match connection.poll()? {
            Some(DaemonMessage::Budget { seq, tiers, .. }) => {
                let Some(hbm) = tiers.iter().find(|t| t.tier == Tier::Hbm) else { continue };
                let Some(holder) = weak.upgrade() else { return Ok(()) };
                let mut met = holder.meet_hbm_budget(hbm.bytes);
                if let Some(peer) = tiers.iter().find(|t| t.tier == Tier::Peer) {
                    // What it may borrow from neighbours (a pool the daemon shares out).
                    met = met.and_then(|()| holder.meet_peer_budget(peer.bytes));
                }
                if let Some(host) = tiers.iter().find(|t| t.tier == Tier::Host) {
                    // Its share of the node's pinned host memory (`[tiers] host`).
                    met = met.and_then(|()| holder.meet_host_budget(host.bytes));
                }
                match met {
                    Ok(()) => connection.send(&ClientMessage::BudgetMet { seq })?,
                    // Not acknowledged: the daemon's deadline marks this tenant late.
                    Err(e) => eprintln!("tiermem: daemon link: budget of {} bytes: {e}", hbm.bytes),
                }
                shared.update(|s| {
                    s.budget = Some(hbm.bytes);
                    s.target = Some(hbm.target);
                    s.budgets_applied += 1;
                });
                next_report = Instant::now(); // report what meeting it changed
            }
            Some(DaemonMessage::Lent { gpu, slab_bytes, ids }) => {
                let fds = connection.take_fds(ids.len(), "lent")?;
                let Some(holder) = weak.upgrade() else { return Ok(()) };
                let slabs: Vec<(u64, std::os::fd::BorrowedFd<'_>)> =
                    ids.iter().zip(&fds).map(|(&id, fd)| (id, std::os::fd::AsFd::as_fd(fd))).collect();
                let failed = holder.engine().adopt_lent_slabs(gpu as usize, slab_bytes as usize, &slabs);
                if let Some((_, e)) = failed.first() {
                    eprintln!("tiermem: daemon link: {} lent slab(s) of GPU {gpu} not mapped: {e}", failed.len());
                    connection.send(&ClientMessage::Returned { ids: failed.iter().map(|(id, _)| *id).collect() })?;
                }
                next_report = Instant::now();
            }
            Some(DaemonMessage::Return { ids, .. }) => {
                let Some(holder) = weak.upgrade() else { return Ok(()) };
                match holder.engine().return_lent_slabs(&ids) {
                    Ok(returned) if !returned.is_empty() => {
                        connection.send(&ClientMessage::Returned { ids: returned })?
                    }
                    Ok(_) => {}
                    // Not returned: the daemon's deadline escalates (docs/daemon.md).
                    Err(e) => eprintln!("tiermem: daemon link: returning lent slabs {ids:?}: {e}"),
                }
                next_report = Instant::now();
            }
            Some(DaemonMessage::Error { kind, message }) => {
                return Err(tiermem_protocol::ProtocolError::Refused { kind, message }.into())
            }
            Some(_) | None => {}
        }
    }
}

/// Whether the engine maps slabs lent by other processes: it has neighbours it can reach.
fn borrows_lent(engine: &tiermem::Engine) -> bool {
    !engine.device_info().peers.is_empty()
}

/// What the engine holds, per tier (HBM, peer, host, file), as the daemon counts it. What it
/// would borrow from neighbours if it could: what does not fit its HBM, up to what its
/// lenders offered (`peer_offered`), or all of it where lenders of other processes may lend
/// (`accepts_lent`).
pub(crate) fn usage_of(stats: &Stats, peer_offered: u64, accepts_lent: bool) -> [TierUsage; 4] {
    let chunk = stats.chunk_size as u64;
    let acquired: u64 = stats.buffers.iter().map(|b| b.acquired as u64).sum::<u64>() * chunk;
    let allocated: u64 = stats.buffers.iter().map(|b| b.chunks as u64).sum::<u64>() * chunk;
    let hbm = TierUsage { used: stats.tiers[Tier::Hbm].used_bytes as u64, acquired, demand: allocated };
    let host = TierUsage {
        used: stats.tiers[Tier::Host].used_bytes as u64,
        acquired: 0,
        demand: stats.tiers[Tier::Host].used_bytes as u64,
    };
    let file_used = stats.tiers.get(Tier::File).map_or(0, |f| f.used_bytes as u64);
    let file = TierUsage { used: file_used, acquired: 0, demand: file_used };
    let peer_used = stats.tiers.get(Tier::Peer).map_or(0, |p| p.used_bytes as u64);
    let beyond_hbm = allocated.saturating_sub(stats.tiers[Tier::Hbm].capacity_bytes as u64);
    let borrowable = if accepts_lent { beyond_hbm } else { beyond_hbm.min(peer_offered) };
    let peer = TierUsage { used: peer_used, acquired: 0, demand: borrowable.max(peer_used) };
    [hbm, peer, host, file]
}

pub(crate) fn transfers_of(stats: &Stats) -> TransferCounters {
    TransferCounters {
        bytes_in: stats.bytes_in,
        bytes_out: stats.bytes_out,
        evictions: stats.transfers.evictions,
        stall_us: (stats.transfers.stall_ms * 1000.0) as u64,
        acquires: stats.transfers.acquires,
        largest_acquire_bytes: stats.transfers.largest_acquire * stats.chunk_size as u64,
    }
}
