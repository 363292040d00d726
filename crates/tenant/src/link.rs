//! The link's thread: register, report, apply budgets; reconnect when the daemon goes away.
//!
//! One thread per tenant (an engine, or a GPU of the interposition library), and while
//! connected a second that readies it for cuts (pins room ahead) so that the first is never
//! busy with that when a budget comes. Both hold the tenant only weakly (a strong reference for
//! one loop iteration or one call at a time), so dropping its last owner ends the link. A
//! budget is applied on the first thread: `Tenant::meet_budget` (for an engine,
//! `set_hbm_budget` starts sending the excess down and `finish` waits until the smaller budget
//! is met); only once met is it acknowledged (`budget_met`). While the daemon is away the
//! tenant keeps the budget it has, and the thread tries again with a growing pause (up to
//! [`MAX_BACKOFF`]).

use crate::client::Connection;
use crate::{LinkError, LinkState, Registration, Tenant, Usage};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};
use tiermem_protocol::{ClientMessage, DaemonMessage, Tier, USAGE_HEARTBEAT};

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
}

/// Runs until `shared.stop` is set or the engine is gone.
pub(crate) fn run(tenant: Weak<dyn Tenant>, shared: Arc<Shared>, options: Options) {
    let mut backoff = Duration::from_millis(50);
    let mut last_error: Option<String> = None;
    while !shared.stop.load(Ordering::Acquire) {
        match session(&tenant, &shared, &options) {
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

/// The `tiermem run` this process runs under: the pid it names in `TIERMEM_RUN_PID`, which its
/// programs' children inherit (protocol: `register`'s `job`).
fn job_of_process() -> Option<u32> {
    std::env::var("TIERMEM_RUN_PID").ok()?.parse().ok()
}

/// One connection's life: `Ok` when the link should end (stopped, tenant gone).
fn session(weak: &Weak<dyn Tenant>, shared: &Shared, options: &Options) -> Result<(), LinkError> {
    let mut connection = Connection::open(&options.socket, concat!("tiermem ", env!("CARGO_PKG_VERSION")))?;
    let Some(holder) = weak.upgrade() else { return Ok(()) };
    let Registration { gpu, chunk_bytes, wants, held, lent_slab_bytes, waits } = holder.registration();
    drop(holder);
    let register = ClientMessage::Register {
        pid: std::process::id(),
        label: options.label.clone(),
        gpu,
        chunk_bytes,
        wants,
        held,
        lent_slab_bytes,
        waits,
        job: job_of_process(),
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
    let ended = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let readying = || ready_for_cuts_until(weak, shared, &ended);
        let ready_thread = match std::thread::Builder::new().name("tiermem-ready".into()).spawn_scoped(scope, readying)
        {
            Ok(handle) => Some(handle),
            Err(e) => {
                eprintln!(
                    "tiermem: daemon link: no thread to pin room ahead of budget cuts ({e}); cuts pin as they go"
                );
                None
            }
        };
        let served = serve(connection, weak, shared, options.report_every);
        ended.store(true, Ordering::Release);
        // Whatever ended the session, the tenant waits for no daemon it has lost, nor makes
        // ready for its turns.
        let (waiting, others_wait) = shared.state.lock().map_or((true, true), |s| (s.waiting_for_turn, s.others_wait));
        if let Some(holder) = weak.upgrade() {
            if waiting {
                holder.wait_for_turn(false);
            }
            if others_wait {
                holder.others_wait(false);
            }
        }
        shared.update(|s| (s.waiting_for_turn, s.others_wait) = (false, false));
        if let Some(handle) = ready_thread {
            handle.thread().unpark(); // it sleeps until its next turn otherwise
        }
        served
    })
}

/// Readies the tenant for smaller budgets ([`Tenant::ready_for_cuts`]: an engine pins a slab of
/// room to evict into) from [`crate::READY_AFTER`] after registering, every
/// [`crate::READY_EVERY`], until the session ends — on a thread of its own, so that a budget
/// arriving meanwhile is met at once rather than after a slab is pinned (gently pinned, a slab
/// takes a quarter of a second or more). Between turns it sleeps, woken when the session ends.
fn ready_for_cuts_until(weak: &Weak<dyn Tenant>, shared: &Shared, ended: &AtomicBool) {
    let over = || ended.load(Ordering::Acquire) || shared.stop.load(Ordering::Acquire);
    let mut next = Instant::now() + crate::READY_AFTER;
    while !over() {
        let now = Instant::now();
        if now < next {
            // Woken early by the session's end (or spuriously): the loop looks again.
            std::thread::park_timeout(next - now);
            continue;
        }
        let Some(holder) = weak.upgrade() else { return };
        holder.ready_for_cuts();
        next = Instant::now() + crate::READY_EVERY;
    }
}

/// Reports usage and applies what the daemon sends, until the connection fails or the link
/// should end (`Ok`).
fn serve(
    mut connection: Connection,
    weak: &Weak<dyn Tenant>,
    shared: &Shared,
    report_every: Duration,
) -> Result<(), LinkError> {
    let mut last_report: Option<(Usage, Instant)> = None;
    let mut next_report = Instant::now();
    loop {
        if shared.stop.load(Ordering::Acquire) {
            return Ok(());
        }
        let Some(holder) = weak.upgrade() else { return Ok(()) };
        if Instant::now() >= next_report {
            let report = holder.usage();
            // On change, and unchanged at least every heartbeat: the daemon judges a tenant idle
            // only from reports that come (tiermem_protocol::USAGE_HEARTBEAT).
            let due = last_report.is_none_or(|(last, sent)| last != report || sent.elapsed() >= USAGE_HEARTBEAT);
            if due {
                let ([hbm, peer, host, file], transfers) = report;
                connection.send(&ClientMessage::Usage { hbm, host, file, peer, transfers })?;
                last_report = Some((report, Instant::now()));
            }
            next_report = Instant::now() + report_every;
            let returned = holder.lender().map(|engine| engine.returned_lent_slabs()).unwrap_or_default();
            if !returned.is_empty() {
                connection.send(&ClientMessage::Returned { ids: returned })?;
            }
        }
        drop(holder);
        match connection.poll()? {
            Some(DaemonMessage::Budget { seq, tiers, wait, others_wait, .. }) => {
                let Some(hbm) = tiers.iter().find(|t| t.tier == Tier::Hbm) else { continue };
                let Some(holder) = weak.upgrade() else { return Ok(()) };
                if others_wait != shared.state.lock().map_or(!others_wait, |s| s.others_wait) {
                    holder.others_wait(others_wait);
                    shared.update(|s| s.others_wait = others_wait);
                }
                // Held before a cut is met (the pause that meets it then finds no new work), let
                // go after the budget is applied (the program's first pause then uses it).
                let change = wait != shared.state.lock().map_or(!wait, |s| s.waiting_for_turn);
                if change && wait {
                    holder.wait_for_turn(true);
                    shared.update(|s| s.waiting_for_turn = true);
                }
                // HBM first (what leaves it may go to the other tiers), then peer, then host.
                let met = [Tier::Hbm, Tier::Peer, Tier::Host]
                    .into_iter()
                    .filter_map(|tier| tiers.iter().find(|t| t.tier == tier))
                    .try_for_each(|budget| holder.meet_budget(budget.tier, budget.bytes));
                if change && !wait {
                    holder.wait_for_turn(false);
                    shared.update(|s| s.waiting_for_turn = false);
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
                let failed: Vec<(u64, String)> = match holder.lender() {
                    Some(engine) => engine
                        .adopt_lent_slabs(gpu as usize, slab_bytes as usize, &slabs)
                        .into_iter()
                        .map(|(id, e)| (id, e.to_string()))
                        .collect(),
                    None => ids.iter().map(|&id| (id, "this tenant maps no lent slabs".to_string())).collect(),
                };
                if let Some((_, e)) = failed.first() {
                    eprintln!("tiermem: daemon link: {} lent slab(s) of GPU {gpu} not mapped: {e}", failed.len());
                    connection.send(&ClientMessage::Returned { ids: failed.iter().map(|(id, _)| *id).collect() })?;
                }
                next_report = Instant::now();
            }
            Some(DaemonMessage::Return { ids, .. }) => {
                let Some(holder) = weak.upgrade() else { return Ok(()) };
                // A tenant that maps none holds none of them: nothing to give back.
                match holder.lender().map_or(Ok(Vec::new()), |engine| engine.return_lent_slabs(&ids)) {
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
