//! The tenant side of `tiermemd`: an engine, or a program under `tiermem run`, leases its HBM
//! budget from the node daemon.
//!
//! [`DaemonLink::attach`] starts one thread (blocking std sockets, no async runtime, so the
//! Python extension and the C libraries carry none) that registers the [`Tenant`], reports what
//! it holds (on change, at most every [`REPORT_EVERY`]; unchanged, at least every
//! `tiermem_protocol::USAGE_HEARTBEAT`), applies each budget (an engine's with
//! `Engine::set_hbm_budget` + `Engine::finish`) and acknowledges it once met, and reconnects
//! when the daemon restarts, keeping its current budget meanwhile. A linked engine's acquire
//! that does not fit its budget waits for the budget to grow ([`BUDGET_WAIT`]) instead of
//! failing at once. The link lives as long as
//! the engine (whose memory it leases), whoever owns the engine (a Python `Buffer` keeps it
//! alive after its `Pool`): when the engine is dropped the thread ends within a poll, the daemon
//! sees the socket close and re-shares the memory. [`DaemonLink::end`] ends it sooner.
//!
//! `TIERMEM_DAEMON` chooses ([`DaemonSetting`]): `auto` (the default) links when the daemon's
//! socket exists and otherwise runs standalone with the engine's own caps, silently; `off`
//! never links; anything else is a socket path to link to, waiting for a daemon there if there
//! is none yet. `TIERMEM_LABEL` names the tenant for the daemon's configuration.
//!
//! The engine knows nothing of this crate: the front ends (C ABI, Python) call [`attach_from_env`]
//! where they create their engine.

mod client;
mod engine_tenant;
mod link;

pub use client::{query_status, Connection};
use link::{Options, Shared};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tiermem::Engine;
use tiermem_protocol::Tier;

/// How often usage is looked at (and sent when it changed).
pub const REPORT_EVERY: Duration = Duration::from_millis(50);
/// How long a link waits before readying its tenant for cuts ([`Tenant::ready_for_cuts`]), and
/// how often it does then: pinning takes the process's cores and the driver for ~50 ms a GiB,
/// which slowed a tenant that pinned its room at once by 16–17% over its first second on the
/// H200 (BENCHMARKS.md, twenty-seventh session); paced, a tenant that runs for a while has its
/// room pinned and the first second of every tenant is left alone.
pub const READY_AFTER: Duration = Duration::from_secs(2);
pub const READY_EVERY: Duration = Duration::from_secs(1);
/// How long [`attach_from_env`] waits for the first budget to reach its fair share.
pub const SETTLE: Duration = Duration::from_secs(2);
/// How long a linked engine's acquire waits for its budget to grow before failing for want of
/// HBM (`Engine::wait_for_budget`): a newcomer's, or a waking idle tenant's, grows as others
/// give memory back, each within the daemon's deadline (2 s by default).
pub const BUDGET_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error(
        "connecting to tiermemd at {path}: {source} (is `tiermem daemon` running? TIERMEM_DAEMON=off runs without it)"
    )]
    Connect { path: PathBuf, source: std::io::Error },
    #[error("talking to tiermemd: {0}")]
    Protocol(#[from] tiermem_protocol::ProtocolError),
    #[error("tiermemd sent {0} out of turn")]
    Unexpected(&'static str),
}

/// `TIERMEM_DAEMON`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DaemonSetting {
    Off,
    Auto,
    Socket(PathBuf),
}

impl DaemonSetting {
    pub fn from_env() -> Self {
        match std::env::var("TIERMEM_DAEMON").ok().as_deref().map(str::trim) {
            None | Some("") | Some("auto") => Self::Auto,
            Some("off") | Some("0") | Some("no") => Self::Off,
            Some(path) => Self::Socket(PathBuf::from(path)),
        }
    }

    /// The socket to link to now, if any.
    pub fn socket(&self) -> Option<PathBuf> {
        match self {
            Self::Off => None,
            Self::Auto => tiermem_protocol::paths::client_socket().filter(|p| p.exists()),
            Self::Socket(path) => Some(path.clone()),
        }
    }
}

/// What the daemon leases memory to, as the link sees it: a tenant registers one GPU, reports
/// what it holds, and meets each budget its own way. An engine (and whatever owns one, through
/// [`Leaseholder`]) is one; the interposition library of `tiermem run` is another, with no
/// engine (crate `tiermem-preload`).
pub trait Tenant: Send + Sync + 'static {
    /// Called once by [`DaemonLink::attach`], before the link starts.
    fn linking(&self) {}

    /// What registration tells the daemon: the GPU, the chunk size, what it wants and holds.
    fn registration(&self) -> Registration;

    /// What it holds per tier (HBM, peer, host, file) and its transfer counters, as the daemon
    /// counts them; sent when it changes.
    fn usage(&self) -> Usage;

    /// Meets a budget of `bytes` for `tier`, returning once it is met (what exceeds it has
    /// moved elsewhere), or why not: the budget is then not acknowledged and the daemon's
    /// deadline marks the tenant late. Budgets of HBM always come; of peer and host memory
    /// only where the daemon shares those tiers.
    fn meet_budget(&self, tier: Tier, bytes: u64) -> Result<(), String>;

    /// Called by the link on a thread of its own (not the one that meets budgets, which may run
    /// meanwhile), every [`READY_EVERY`] once the tenant has been linked for [`READY_AFTER`]:
    /// one step of readying it for a smaller budget (an engine pins a slab of room to evict
    /// into, `Engine::pin_room_to_evict`).
    fn ready_for_cuts(&self) {}

    /// The engine that maps slabs other processes lend, if this tenant takes them (module
    /// `link`: the daemon's `lent` and `return` messages).
    fn lender(&self) -> Option<&Engine> {
        None
    }

    /// Told to wait for its turn (`true`: start no GPU work), or no longer; only a tenant whose
    /// [`Registration::waits`] is set is told to wait, and every session's end says `false`
    /// (a tenant never stays held by a daemon it has lost). Called on the link's thread: told
    /// to wait before the budget that carries it is met, told no longer after.
    fn wait_for_turn(&self, _wait: bool) {}

    /// Told that another tenant waits for the GPU, so that this one's turn will end in a cut
    /// to what it keeps (`true`), or no longer; every session's end says `false`. It may make
    /// ready to give its memory back (a program under `tiermem run` makes host chunks to send
    /// its chunks into). Called on the link's thread, before the budget that says it is met.
    fn others_wait(&self, _others_wait: bool) {}
}

/// A tenant's registration, less who it is (the link adds pid and label).
#[derive(Debug, Clone)]
pub struct Registration {
    pub gpu: tiermem_protocol::GpuId,
    pub chunk_bytes: u64,
    pub wants: Vec<tiermem_protocol::TierBytes>,
    pub held: Vec<tiermem_protocol::TierBytes>,
    /// The size of the slabs it maps when other processes lend (`None`: it takes none).
    pub lent_slab_bytes: Option<u64>,
    /// It can be told to wait for its turn ([`Tenant::wait_for_turn`]).
    pub waits: bool,
}

/// A tenant's use per tier (HBM, peer, host, file) and its transfer counters.
pub type Usage = ([tiermem_protocol::TierUsage; 4], tiermem_protocol::TransferCounters);

/// What owns an engine the daemon leases HBM to: the engine itself, or something that meets a
/// budget its own way (the VRAM swap store caps its own limits by it, crate `tiermem-swap`).
/// Every such owner is a [`Tenant`] (module `engine_tenant`).
pub trait Leaseholder: Send + Sync + 'static {
    /// The engine whose use is reported.
    fn engine(&self) -> &Engine;

    /// HBM this would use alone, asked for at registration. Default: the engine's cap.
    fn wants_hbm(&self) -> u64 {
        self.engine().hbm_cap() as u64
    }

    /// Meets an HBM budget of `bytes`, returning once it is met (what exceeds it has moved
    /// down and its HBM has gone back to the driver). Default: the engine's budget.
    fn meet_hbm_budget(&self, bytes: u64) -> Result<(), String> {
        let engine = self.engine();
        engine.set_hbm_budget(bytes as usize).and_then(|ticket| engine.finish(ticket)).map_err(|e| e.to_string())
    }

    /// Meets a budget of `bytes` borrowed from neighbour GPUs, returning once what exceeds it
    /// has been given back. Default: the engine's peer budget.
    fn meet_peer_budget(&self, bytes: u64) -> Result<(), String> {
        self.engine().set_peer_budget(bytes as usize).map(drop).map_err(|e| e.to_string())
    }

    /// Meets a budget of `bytes` of the node's pinned host memory, returning once what
    /// exceeds it has spilled to the file tier and spare pinned memory is unpinned. Default:
    /// the engine's host budget; an error (the budget is not acknowledged, so the daemon sees
    /// the tenant late) while more than the budget stays in use, as without a file tier.
    fn meet_host_budget(&self, bytes: u64) -> Result<(), String> {
        let engine = self.engine();
        engine.set_host_budget(bytes as usize).map_err(|e| e.to_string())?;
        let stats = engine.summary();
        let (used, cap) =
            (stats.tiers[tiermem::Tier::Host].used_bytes, stats.tiers[tiermem::Tier::Host].capacity_bytes);
        match used <= cap {
            true => Ok(()),
            false => Err(format!(
                "{} of host memory in use, {} over the budget (no file tier to spill it to: it leaves as it is paged in)",
                tiermem::format_size(used),
                tiermem::format_size(used - cap)
            )),
        }
    }
}

impl Leaseholder for Engine {
    fn engine(&self) -> &Engine {
        self
    }
}

/// What the link knows, for callers and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkState {
    pub connected: bool,
    /// The id the daemon gave in the current (or last) session.
    pub tenant: Option<u64>,
    /// Sessions opened so far (more than one: the daemon restarted, or the link broke).
    pub sessions: u64,
    /// The HBM budget last applied, and the fair share it is moving to.
    pub budget: Option<u64>,
    pub target: Option<u64>,
    pub budgets_applied: u64,
    /// Told to wait for its turn by the last budget, and told that others wait for its turn
    /// (both reset when a session ends).
    pub waiting_for_turn: bool,
    pub others_wait: bool,
    /// Attempts to reach the daemon that failed.
    pub failed_attempts: u64,
}

/// A running link between one engine and the daemon: a handle to watch it. Dropping the
/// handle leaves the link running until the engine is dropped; [`DaemonLink::end`] ends it.
pub struct DaemonLink {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DaemonLink {
    /// Starts linking `holder` (an engine, what owns one, or another [`Tenant`]) to the daemon
    /// at `socket`. Returns at once.
    pub fn attach<T: Tenant>(holder: &Arc<T>, socket: PathBuf, label: Option<String>) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(LinkState::default()),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let options = Options { socket, label, report_every: REPORT_EVERY };
        holder.linking();
        let weak: std::sync::Weak<dyn Tenant> = Arc::downgrade(holder) as std::sync::Weak<T>;
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("tiermem-daemon-link".into())
            .spawn(move || link::run(weak, thread_shared, options))?;
        Ok(Self { shared, thread: Some(thread) })
    }

    pub fn state(&self) -> LinkState {
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits until `condition` holds of the link's state, or `timeout` passes; returns the
    /// state it found.
    pub fn wait_for(&self, timeout: Duration, condition: impl Fn(&LinkState) -> bool) -> LinkState {
        let deadline = Instant::now() + timeout;
        let mut state = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        while !condition(&state) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            state = self.shared.changed.wait_timeout(state, left).unwrap_or_else(|p| p.into_inner()).0;
        }
        state.clone()
    }
}

impl DaemonLink {
    /// Ends the link now (the daemon re-shares the engine's memory, though the engine may still
    /// hold it: only for an engine about to be dropped, or tests) and waits for its thread.
    pub fn end(mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Links `engine` as `TIERMEM_DAEMON` and `TIERMEM_LABEL` say; `None` when it runs
/// standalone. When a daemon answers, waits (up to [`SETTLE`]) for the first budget to reach
/// its fair share, so the engine starts within its budget.
pub fn attach_from_env<T: Tenant>(holder: &Arc<T>) -> Option<DaemonLink> {
    let socket = DaemonSetting::from_env().socket()?;
    let label = std::env::var("TIERMEM_LABEL").ok().filter(|l| !l.trim().is_empty());
    let link = match DaemonLink::attach(holder, socket, label) {
        Ok(link) => link,
        Err(e) => {
            eprintln!("tiermem: could not start the daemon link thread: {e}; running standalone");
            return None;
        }
    };
    link.wait_for(SETTLE, |s| {
        (s.budget.is_some() && s.budget == s.target) || (s.sessions == 0 && s.failed_attempts > 0)
    });
    Some(link)
}
