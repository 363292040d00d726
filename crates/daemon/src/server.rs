//! The mechanism: the Unix socket, one task per connection, a timer for deadlines, a census
//! of each GPU's memory through NVML every half second (census.rs). Every
//! decision is the registry's (registry.rs); this file reads frames, checks their order
//! (`tiermem_protocol::ServerSession`), feeds the registry and delivers what it returns.
//!
//! A connection that breaks the protocol gets an `error` and is closed; nothing a client sends
//! can stop the daemon. A tenant whose connection closes (exit, crash, `kill -9`) is removed
//! at once and its memory re-shared. The registry lock is a std mutex held only for one
//! registry call, never across an await.

use crate::config::{Config, Identity};
use crate::lending::{Action, LenderId, Lending, SlabId};
use crate::registry::{Joining, Outbox, Registry, TenantId};
use crate::wire::{read_some, write_frame, Outgoing};
use crate::{log, DaemonError, DAEMON_NAME};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tiermem_protocol::fd_passing::FdQueue;
use tiermem_protocol::{
    encode, ClientMessage, DaemonMessage, FrameDecoder, ProtocolError, ServerSession, Tier, PROTOCOL_VERSION,
};
use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;

/// A connection has this long to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// The chunk sizes a tenant may register with (a budget is whole chunks of the largest).
const MIN_CHUNK: u64 = 4 << 10;
const MAX_CHUNK: u64 = 1 << 30;
/// The largest slab a tenant may be lent.
const MAX_SLAB: u64 = 1 << 30;
/// How often deadlines are checked.
const TICK: Duration = Duration::from_millis(50);
/// How often each GPU with tenants is counted (census.rs).
const CENSUS_EVERY: Duration = Duration::from_millis(500);

/// Messages a connection may have queued unsent: a client that does not read its replies
/// (budgets, status) is closed rather than let the daemon's memory grow.
const QUEUED: usize = 64;

/// The way to one connection's writer.
#[derive(Clone)]
struct Mailbox {
    tx: mpsc::Sender<Outgoing>,
    /// Told when the queue is full: the connection is then closed.
    stalled: Arc<tokio::sync::Notify>,
}

impl Mailbox {
    fn post(&self, message: DaemonMessage) {
        self.post_with_fds(message, Vec::new())
    }

    /// `message` with file descriptors beside it (fd_passing in tiermem-protocol); they are
    /// closed here once sent (the receiver has its own), or with the message if it cannot be.
    fn post_with_fds(&self, message: DaemonMessage, fds: Vec<std::os::fd::OwnedFd>) {
        if let Err(mpsc::error::TrySendError::Full(_)) = self.tx.try_send(Outgoing { message, fds }) {
            self.stalled.notify_one();
        }
    }
}

/// The registry, the lending, and the way to each tenant's and lender's connection.
struct Hub {
    registry: Registry,
    outboxes: HashMap<TenantId, Mailbox>,
    lending: Lending,
    lenders: HashMap<LenderId, Mailbox>,
}

type SharedHub = Arc<Mutex<Hub>>;

fn lock(hub: &SharedHub) -> MutexGuard<'_, Hub> {
    // Every registry call leaves it consistent before returning: a panic cannot tear it.
    hub.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Hub {
    fn deliver(&mut self, outbox: Outbox) {
        for (id, begun) in self.registry.take_turns() {
            log(&match begun {
                true => format!("tenant {id}: its whole working set is admitted (a turn begins)"),
                false => format!("tenant {id}: waits for its turn with a little of its working set"),
            });
        }
        for (gpu, in_turns) in self.registry.take_sharing_changes() {
            log(&match in_turns {
                true => format!(
                    "GPU {gpu}: working sets in turns (hbm_sharing auto: every tenant can wait, each of its own job)"
                ),
                false => {
                    format!("GPU {gpu}: fair share (hbm_sharing auto: a tenant that cannot wait, two of one job, or a job on several GPUs)")
                }
            });
        }
        for (id, idle) in self.registry.take_idles() {
            log(&match idle {
                true => format!(
                    "tenant {id}: idle (no acquire reported for idle_after_ms): lends all but its largest acquire"
                ),
                false => format!("tenant {id}: working again"),
            });
        }
        for (id, message) in outbox {
            if let Some(mailbox) = self.outboxes.get(&id) {
                mailbox.post(message);
            }
        }
    }

    /// Carries out what the lending decided; `exported` holds the descriptors of slabs a
    /// lender just sent (each goes to its borrower, or is closed).
    fn carry_out(&self, actions: Vec<Action>, mut exported: HashMap<SlabId, std::os::fd::OwnedFd>) {
        for action in actions {
            match action {
                Action::Make { lender, ids, slab_bytes } => {
                    if let Some(mailbox) = self.lenders.get(&lender) {
                        mailbox.post(DaemonMessage::MakeSlabs { ids, slab_bytes });
                    }
                }
                Action::Lend { borrower, gpu, slab_bytes, ids } => {
                    let fds = ids.iter().filter_map(|id| exported.remove(id)).collect();
                    if let Some(mailbox) = self.outboxes.get(&borrower) {
                        mailbox.post_with_fds(DaemonMessage::Lent { gpu, slab_bytes, ids }, fds);
                    }
                }
                Action::Return { borrower, ids, deadline_ms } => {
                    if let Some(mailbox) = self.outboxes.get(&borrower) {
                        mailbox.post(DaemonMessage::Return { ids, deadline_ms });
                    }
                }
                Action::Release { lender, ids } => {
                    if let Some(mailbox) = self.lenders.get(&lender) {
                        mailbox.post(DaemonMessage::Release { ids });
                    }
                }
                Action::Late { borrower, pid, ids, kill } => escalate(borrower, pid, &ids, kill),
            }
        }
    }
}

/// A borrower kept lent slabs past their deadline (lending.rs, "Escalation").
fn escalate(borrower: TenantId, pid: u32, ids: &[SlabId], kill: bool) {
    let what = format!("tenant {borrower} (pid {pid}) did not return lent slab(s) {ids:?} in time");
    if !kill || pid == 0 {
        let why = if kill { " (its pid is only its own word: not killed)" } else { "" };
        log(&format!("{what}; the lender waits{why}"));
        return;
    }
    // SAFETY: kill(2) with a pid the kernel gave for this connection and a valid signal.
    let outcome = unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    match outcome {
        0 => log(&format!("{what}: killed ([lending] escalate = \"kill\"); the driver unmaps its memory")),
        _ => log(&format!("{what}: could not kill it: {}", std::io::Error::last_os_error())),
    }
}

/// Binds the socket at `path` (replacing a stale one; refusing while a daemon answers there)
/// with the config's permission bits.
pub fn bind(path: &Path, config: &Config) -> Result<UnixListener, DaemonError> {
    let socket = |source| DaemonError::Socket { path: path.to_owned(), source };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(socket)?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(DaemonError::AlreadyRunning(path.to_owned()));
        }
        std::fs::remove_file(path).map_err(socket)?;
    }
    let listener = UnixListener::bind(path).map_err(socket)?;
    let mode = config.socket_mode_bits().map_err(DaemonError::Config)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(socket)?;
    Ok(listener)
}

/// Serves `listener` until `shutdown` resolves (never, for `tiermem daemon`).
pub async fn serve(listener: UnixListener, config: Config, shutdown: impl std::future::Future<Output = ()>) {
    serve_with_metrics(listener, None, config, shutdown).await
}

/// [`serve`], and Prometheus metrics on `metrics` (metrics.rs).
pub async fn serve_with_metrics(
    listener: UnixListener,
    metrics: Option<tokio::net::TcpListener>,
    config: Config,
    shutdown: impl std::future::Future<Output = ()>,
) {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let lending = Lending::new(config.lending.clone());
    let hub = Arc::new(Mutex::new(Hub {
        registry: Registry::new(config, Instant::now(), uid),
        outboxes: HashMap::new(),
        lending,
        lenders: HashMap::new(),
    }));
    let ticker = tokio::spawn(expire_deadlines(Arc::clone(&hub)));
    let census = tokio::spawn(take_censuses(Arc::clone(&hub)));
    let metrics_task = metrics.map(|listener| {
        let (hub, metrics) = (Arc::clone(&hub), crate::metrics::Metrics::default());
        let render = Arc::new(move || {
            let mut hub = lock(&hub);
            let lenders = hub.lending.status();
            metrics.render(&mut hub.registry, &lenders)
        });
        tokio::spawn(crate::metrics::serve_http(listener, render))
    });
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    tokio::spawn(connection(stream, Arc::clone(&hub)));
                }
                // Out of descriptors and the like: the next accept may succeed.
                Err(e) => {
                    log(&format!("accept: {e}"));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    ticker.abort();
    census.abort();
    if let Some(task) = metrics_task {
        task.abort();
    }
}

async fn expire_deadlines(hub: SharedHub) {
    let mut interval = tokio::time::interval(TICK);
    loop {
        interval.tick().await;
        let mut hub = lock(&hub);
        let (late, outbox) = hub.registry.expire_deadlines(Instant::now());
        for id in late {
            log(&format!("tenant {id} did not meet its smaller budget in time: counted at its reported use"));
        }
        hub.deliver(outbox);
        let actions = hub.lending.expire(Instant::now());
        hub.carry_out(actions, HashMap::new());
    }
}

/// Every [`CENSUS_EVERY`], what NVML counts on each real GPU with tenants goes into the
/// registry (census.rs). NVML's calls block, so they run off the async threads; a GPU NVML
/// cannot count is logged once and its capacity stays as configured.
async fn take_censuses(hub: SharedHub) {
    let mut interval = tokio::time::interval(CENSUS_EVERY);
    let mut failing: std::collections::HashSet<u32> = std::collections::HashSet::new();
    loop {
        interval.tick().await;
        let gpus = lock(&hub).registry.census_gpus();
        if gpus.is_empty() {
            continue;
        }
        let Ok(counted) = tokio::task::spawn_blocking(move || {
            gpus.into_iter()
                .map(|(index, uuid)| (index, tiermem::mechanism::cuda::nvml::census(&uuid)))
                .collect::<Vec<_>>()
        })
        .await
        else {
            continue;
        };
        let mut hub = lock(&hub);
        for (index, census) in counted {
            match census {
                Ok(census) => {
                    failing.remove(&index);
                    let outbox = hub.registry.record_census(index, &census, Instant::now());
                    hub.deliver(outbox);
                }
                Err(why) => {
                    if failing.insert(index) {
                        log(&format!("GPU {index}: no census of its memory, capacity as configured: {why}"));
                    }
                }
            }
        }
    }
}

/// The kernel's word on who is at the other end, and its cgroup.
fn identify(stream: &UnixStream) -> Identity {
    let cred = stream.peer_cred().ok();
    let pid = cred.as_ref().and_then(|c| c.pid()).unwrap_or(0).max(0) as u32;
    Identity { uid: cred.map_or(u32::MAX, |c| c.uid()), pid, cgroup: crate::peer::cgroup_of(pid), label: None }
}

/// Who is at the other end of a connection, once it has said.
#[derive(Default)]
struct Role {
    tenant: Option<TenantId>,
    lender: Option<LenderId>,
    /// The pid came from the kernel (`SO_PEERCRED`), not the client's word: only such a
    /// process is ever killed for keeping lent memory (lending.rs, "Escalation").
    pid_verified: bool,
}

async fn connection(stream: UnixStream, hub: SharedHub) {
    let mut who = identify(&stream);
    let mut role = Role { pid_verified: who.pid != 0, ..Role::default() };
    let (reader, mut writer) = stream.into_split();
    let (tx, mut rx) = mpsc::channel::<Outgoing>(QUEUED);
    let mailbox = Mailbox { tx, stalled: Arc::new(tokio::sync::Notify::new()) };
    let write_task = tokio::spawn(async move {
        while let Some(Outgoing { message, fds }) = rx.recv().await {
            // A reply too large for a frame (a status of very many tenants) becomes an error.
            let (frame, last) = match encode(&message) {
                Ok(frame) => (frame, matches!(message, DaemonMessage::Error { .. })),
                Err(e) => match encode(&e.to_message()) {
                    Ok(frame) => (frame, true),
                    Err(_) => break,
                },
            };
            if write_frame(&mut writer, &frame, &fds).await.is_err() || last {
                break;
            }
        }
        let _ = writer.shutdown().await;
    });
    let mut session = ServerSession::new();
    let mut decoder = FrameDecoder::new();
    let mut fds = FdQueue::new();
    let mut buffer = vec![0u8; 16 * 1024];
    let outcome: Result<(), ProtocolError> = async {
        loop {
            while let Some(message) = decoder.next_message::<ClientMessage>()? {
                session.accept(&message)?;
                handle(message, &mut who, &mut role, &mut fds, &mailbox, &hub)?;
            }
            let read = async {
                tokio::select! {
                    read = read_some(&reader, &mut buffer, &mut fds) => Ok(read?),
                    _ = mailbox.stalled.notified() => Err(ProtocolError::Refused {
                        kind: tiermem_protocol::ErrorKind::Refused,
                        message: format!("more than {QUEUED} replies unread: a client must read what the daemon sends"),
                    }),
                }
            };
            let n = match session.state() {
                tiermem_protocol::SessionState::AwaitHello => {
                    tokio::time::timeout(HELLO_TIMEOUT, read).await.map_err(|_| ProtocolError::Timeout)??
                }
                _ => read.await?,
            };
            if n == 0 {
                return Ok(());
            }
            decoder.extend(&buffer[..n]);
        }
    }
    .await;
    if let Some(id) = role.tenant {
        let mut hub = lock(&hub);
        hub.outboxes.remove(&id);
        let outbox = hub.registry.disconnect(id, Instant::now());
        hub.deliver(outbox);
        let actions = hub.lending.remove_borrower(id, Instant::now());
        hub.carry_out(actions, HashMap::new());
        log(&format!("tenant {id} (pid {}) left; {} tenants", who.pid, hub.registry.tenant_count()));
    }
    if let Some(id) = role.lender {
        let mut hub = lock(&hub);
        hub.lenders.remove(&id);
        let actions = hub.lending.remove_lender(id, Instant::now());
        hub.carry_out(actions, HashMap::new());
        log(&format!("lender {id} (pid {}) left: what it lent is asked back", who.pid));
    }
    if let Err(error) = outcome {
        if !matches!(error, ProtocolError::Io(_) | ProtocolError::Closed) {
            log(&format!("closing a connection from pid {} (uid {}): {error}", who.pid, who.uid));
            mailbox.post(error.to_message());
        }
    }
    drop(mailbox);
    let _ = tokio::time::timeout(Duration::from_secs(1), write_task).await;
}

/// One message, in order (the session checked it).
fn handle(
    message: ClientMessage,
    who: &mut Identity,
    role: &mut Role,
    fds: &mut FdQueue,
    mailbox: &Mailbox,
    hub: &SharedHub,
) -> Result<(), ProtocolError> {
    let now = Instant::now();
    let refused = |message: String| ProtocolError::Refused { kind: tiermem_protocol::ErrorKind::Refused, message };
    match message {
        ClientMessage::Hello { .. } => {
            mailbox.post(DaemonMessage::Welcome { version: PROTOCOL_VERSION, daemon: DAEMON_NAME.into() });
        }
        ClientMessage::Register { pid, label, gpu, chunk_bytes, wants, held, lent_slab_bytes, waits, job } => {
            if !chunk_bytes.is_power_of_two() || !(MIN_CHUNK..=MAX_CHUNK).contains(&chunk_bytes) {
                return Err(refused(format!(
                    "register: a chunk of {chunk_bytes} bytes (a power of two from 4 KiB to 1 GiB)"
                )));
            }
            if lent_slab_bytes.is_some_and(|slab| slab == 0 || slab % chunk_bytes != 0 || slab > MAX_SLAB) {
                return Err(refused(format!(
                    "register: lent slabs of {lent_slab_bytes:?} bytes (whole chunks of {chunk_bytes}, at most {MAX_SLAB})"
                )));
            }
            if who.pid == 0 {
                who.pid = pid; // no SO_PEERCRED pid: take the tenant's word
            }
            who.label = label;
            let mut hub = lock(hub);
            let joining = Joining { gpu: gpu.clone(), chunk_bytes, wants: &wants, held: &held, waits, job };
            let (id, name, outbox) = hub.registry.register(who.clone(), joining, now);
            role.tenant = Some(id);
            hub.outboxes.insert(id, mailbox.clone());
            mailbox.post(DaemonMessage::Registered { tenant: id, name: name.clone() });
            hub.deliver(outbox);
            if let Some(slab) = lent_slab_bytes {
                let pid = if role.pid_verified { who.pid } else { 0 };
                let weight = hub.registry.weight_of(id);
                let actions = hub.lending.add_borrower(id, pid, gpu.index, slab, weight, now);
                hub.carry_out(actions, HashMap::new());
            }
            log(&format!(
                "tenant {id} registered: pid {} uid {} gpu {} as {name:?}{}; {} tenants",
                who.pid,
                who.uid,
                gpu.index,
                who.label.as_deref().map(|l| format!(" (label {l:?})")).unwrap_or_default(),
                hub.registry.tenant_count()
            ));
        }
        ClientMessage::Usage { hbm, host, file, peer, transfers } => {
            let Some(id) = role.tenant else { return Ok(()) };
            let mut hub = lock(hub);
            hub.registry.record_transfers(id, transfers, now);
            let outbox = hub.registry.usage(
                id,
                [(Tier::Hbm, hbm), (Tier::Peer, peer), (Tier::Host, host), (Tier::File, file)],
                now,
            );
            hub.deliver(outbox);
            let actions = hub.lending.set_want(id, peer.demand, now);
            hub.carry_out(actions, HashMap::new());
        }
        ClientMessage::BudgetMet { seq } => {
            let Some(id) = role.tenant else { return Ok(()) };
            let mut hub = lock(hub);
            let outbox = hub.registry.budget_met(id, seq, now);
            hub.deliver(outbox);
        }
        ClientMessage::StatusRequest => {
            let hub = lock(hub);
            let mut report = hub.registry.status(who.uid, role.tenant, now);
            report.lenders = hub.lending.status();
            mailbox.post(DaemonMessage::Status(report));
        }
        ClientMessage::Lend { pid, gpu, offer_bytes } => {
            let mut hub = lock(hub);
            let daemon_uid = hub.registry.daemon_uid();
            if !hub.lending.may_lend(who.uid, daemon_uid) {
                return Err(refused(format!(
                    "lend: uid {} may not lend (its memory would be mapped by other tenants): \
                     add it to [lending] lender_uids in the daemon's config",
                    who.uid
                )));
            }
            if who.pid == 0 {
                who.pid = pid;
            }
            let (id, actions) = hub.lending.add_lender(who.pid, gpu.index, offer_bytes, now);
            role.lender = Some(id);
            hub.lenders.insert(id, mailbox.clone());
            mailbox.post(DaemonMessage::Registered { tenant: id, name: "lender".into() });
            hub.carry_out(actions, HashMap::new());
            log(&format!("lender {id} registered: pid {} gpu {} offers {offer_bytes} bytes", who.pid, gpu.index));
        }
        ClientMessage::Offer { bytes } => {
            let Some(id) = role.lender else { return Ok(()) };
            let mut hub = lock(hub);
            let actions = hub.lending.set_offer(id, bytes, now);
            hub.carry_out(actions, HashMap::new());
        }
        ClientMessage::Slabs { ids, failed, error } => {
            let Some(id) = role.lender else { return Ok(()) };
            let exported = fds.take(ids.len(), "slabs")?;
            if let Some(why) = error.filter(|_| !failed.is_empty()) {
                log(&format!("lender {id} could not make {} slab(s): {why}", failed.len()));
            }
            let mut hub = lock(hub);
            let actions = hub.lending.made(id, &ids, &failed, now).map_err(refused)?;
            hub.carry_out(actions, ids.into_iter().zip(exported).collect());
        }
        ClientMessage::Returned { ids } => {
            let Some(id) = role.tenant else { return Ok(()) };
            let mut hub = lock(hub);
            let actions = hub.lending.returned(id, &ids, now);
            hub.carry_out(actions, HashMap::new());
        }
    }
    Ok(())
}

/// Runs the daemon in the foreground on a runtime of its own thread, until the process ends.
pub fn run(config: Config, socket: Option<PathBuf>) -> Result<(), DaemonError> {
    let path = socket.or_else(tiermem_protocol::paths::daemon_socket).ok_or(DaemonError::NoSocketPath)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| DaemonError::Socket { path: path.clone(), source: e })?;
    runtime.block_on(async {
        let listener = bind(&path, &config)?;
        log(&format!("listening on {} (protocol {PROTOCOL_VERSION})", path.display()));
        let metrics = match &config.metrics {
            None => None,
            Some(address) => {
                let metrics = tokio::net::TcpListener::bind(address.as_str())
                    .await
                    .map_err(|source| DaemonError::Metrics { address: address.clone(), source })?;
                let bound = metrics.local_addr().map_or_else(|_| address.clone(), |a| a.to_string());
                log(&format!("metrics on http://{bound}/metrics"));
                Some(metrics)
            }
        };
        serve_with_metrics(listener, metrics, config, std::future::pending()).await;
        Ok(())
    })
}
