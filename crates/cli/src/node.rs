//! `tiermem daemon` and `tiermem status`: the node daemon in the foreground (logs on stderr),
//! and what it says of each GPU, tier and tenant: used, budget and lent memory, with bars, and
//! what each tenant moved.

use std::path::PathBuf;
use tiermem::format_size;
use tiermem_protocol::{PoolStatus, ShareStatus, StatusReport, TenantStatus, TransferCounters};

#[derive(clap::Args)]
pub struct DaemonArgs {
    /// The TOML configuration (docs/daemon.md); without it: one tenant class, all weights 1.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The socket to listen on (default: TIERMEM_SOCKET, else /run/tiermem/tiermemd.sock where
    /// writable, else $XDG_RUNTIME_DIR/tiermem.sock).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDRESS/metrics (e.g. 127.0.0.1:9464); overrides the
    /// config's `metrics`.
    #[arg(long)]
    metrics: Option<String>,
}

pub fn daemon(args: DaemonArgs) -> Result<(), String> {
    let mut config = match &args.config {
        Some(path) => tiermem_daemon::Config::load(path).map_err(|e| e.to_string())?,
        None => tiermem_daemon::Config::default(),
    };
    if args.metrics.is_some() {
        config.metrics = args.metrics;
    }
    tiermem_daemon::run(config, args.socket).map_err(|e| e.to_string())
}

#[derive(clap::Args)]
pub struct StatusArgs {
    /// Print the daemon's report as JSON (for scripts).
    #[arg(long)]
    json: bool,
    /// The daemon's socket (default: as tenants find it, TIERMEM_SOCKET first).
    #[arg(long)]
    socket: Option<PathBuf>,
}

/// The daemon's socket for a command that talks to it: `given` (`--socket`), else where
/// tenants find it (TIERMEM_SOCKET, then the system's and the user's socket, if there).
pub(crate) fn socket_of_daemon(given: Option<PathBuf>) -> Result<PathBuf, String> {
    given.or_else(tiermem_protocol::paths::client_socket).ok_or_else(|| {
        "no tiermemd socket found (--socket, TIERMEM_SOCKET, /run/tiermem/tiermemd.sock, \
         $XDG_RUNTIME_DIR/tiermem.sock): is `tiermem daemon` running?"
            .into()
    })
}

pub fn status(args: StatusArgs) -> Result<(), String> {
    let socket = socket_of_daemon(args.socket)?;
    let report = tiermem_tenant::query_status(&socket).map_err(|e| format!("status: {e}"))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?);
    } else {
        print!("{}", render(&report));
    }
    Ok(())
}

const BAR: usize = 24;

/// `[###===    ]`: `#` used, `=` budget not used, on the scale of the pool's capacity.
pub fn bar(used: u64, budget: u64, capacity: u64) -> String {
    let cells = |bytes: u64| ((bytes as f64 / capacity.max(1) as f64) * BAR as f64).round().min(BAR as f64) as usize;
    let (used_cells, budget_cells) = (cells(used), cells(budget.max(used)));
    format!("[{}{}{}]", "#".repeat(used_cells), "=".repeat(budget_cells - used_cells), " ".repeat(BAR - budget_cells))
}

fn render(report: &StatusReport) -> String {
    let mut out = format!(
        "{}, up {:.0} s, {} tenants{}\n",
        report.daemon,
        report.uptime_ms as f64 / 1000.0,
        report.tenants.len(),
        match report.hidden_tenants {
            0 => String::new(),
            n => format!(" ({n} more not shown to you)"),
        }
    );
    for pool in &report.pools {
        out += &render_pool(pool, &report.tenants);
    }
    if report.pools.is_empty() {
        out += "no tenants yet: pools appear as engines register\n";
    }
    if let Some(line) = host_pinned_line(report) {
        out += &line;
    }
    out += &traffic_rows(report);
    for lender in &report.lenders {
        out += &lender_line(lender);
    }
    out
}

/// The pinned host memory each tenant's engine holds (its host tier, and the room pinned ahead
/// for evictions: "ready"), shown whether or not the daemon shares host memory out; `None` if
/// no tenant holds any.
fn host_pinned_line(report: &StatusReport) -> Option<String> {
    let size = |bytes: u64| format_size(bytes as usize);
    let each: Vec<String> = report
        .tenants
        .iter()
        .filter(|t| t.host_pinned > 0)
        .map(|t| match t.host_ready {
            0 => format!("tenant {} ({}) {}", t.tenant, t.name, size(t.host_pinned)),
            r => format!("tenant {} ({}) {}, {} of it ready", t.tenant, t.name, size(t.host_pinned), size(r)),
        })
        .collect();
    (!each.is_empty()).then(|| format!("\npinned host memory: {}\n", each.join("; ")))
}

/// The columns of the traffic rows: what each tenant moved up and down, the time it stalled
/// waiting for moves, its kernel launches and the share of them with every pointer in HBM (a
/// program under `tiermem run`; `-` for an engine, which sees no launches).
pub const TRAFFIC_COLUMNS: [&str; 7] = ["tenant", "name", "in", "out", "stalled", "launches", "all in HBM"];

/// One tenant's traffic cells: its counters since it started or, given an earlier report's
/// counters and the seconds since, per second over them (`tiermem top`).
pub fn traffic_cells(t: &TenantStatus, earlier: Option<(&TransferCounters, f64)>) -> [String; 7] {
    let now = &t.transfers;
    let zero = TransferCounters::default();
    let (before, seconds) = earlier.unwrap_or((&zero, 0.0));
    let delta = |now: u64, before: u64| now.saturating_sub(before);
    let (bytes_in, bytes_out) = (delta(now.bytes_in, before.bytes_in), delta(now.bytes_out, before.bytes_out));
    let stall_ms = delta(now.stall_us, before.stall_us) as f64 / 1e3;
    let launches = delta(now.launches, before.launches);
    let all_in_hbm = delta(now.launches_all_in_hbm, before.launches_all_in_hbm);
    let share =
        if launches == 0 { "-".to_owned() } else { format!("{:.1}%", all_in_hbm as f64 * 100.0 / launches as f64) };
    let [bytes_in, bytes_out, stalled, launches] = match earlier {
        None => [
            format_size(bytes_in as usize),
            format_size(bytes_out as usize),
            format!("{:.1} s", stall_ms / 1e3),
            launches.to_string(),
        ],
        Some(_) => {
            let per = |x: f64| x / seconds.max(1e-3);
            [
                format!("{}/s", format_size(per(bytes_in as f64) as usize)),
                format!("{}/s", format_size(per(bytes_out as f64) as usize)),
                format!("{:.0} ms/s", per(stall_ms)),
                format!("{:.0}/s", per(launches as f64)),
            ]
        }
    };
    [t.tenant.to_string(), t.name.clone(), bytes_in, bytes_out, stalled, launches, share]
}

/// Whether any tenant has moved anything or launched a kernel.
pub fn any_traffic(tenants: &[TenantStatus]) -> bool {
    tenants.iter().any(|t| t.transfers != TransferCounters::default())
}

/// The traffic of each tenant since it started, if any moved anything ([`traffic_cells`]).
fn traffic_rows(report: &StatusReport) -> String {
    if !any_traffic(&report.tenants) {
        return String::new();
    }
    let row = |c: &[String; 7]| {
        format!("  {:>6} {:<12} {:>11} {:>11} {:>9} {:>10} {:>10}\n", c[0], c[1], c[2], c[3], c[4], c[5], c[6])
    };
    let mut out = String::from("\ntraffic since each tenant started:\n");
    out += &row(&TRAFFIC_COLUMNS.map(String::from));
    for tenant in &report.tenants {
        out += &row(&traffic_cells(tenant, None));
    }
    out
}

/// A lender (`tiermem lend`): what it offers, and what it lends to whom.
fn lender_line(lender: &tiermem_protocol::LenderStatus) -> String {
    let size = |bytes: u64| format_size(bytes as usize);
    let lent: u64 = lender.lent.iter().map(|(_, bytes)| bytes).sum();
    let to: Vec<String> =
        lender.lent.iter().map(|(tenant, bytes)| format!("tenant {tenant} {}", size(*bytes))).collect();
    let returning = match lender.returning {
        0 => String::new(),
        bytes => format!(", {} being returned", size(bytes)),
    };
    format!(
        "GPU {} lender {} (pid {}): {} of {} lent{returning}  {}{}\n",
        lender.gpu,
        lender.lender,
        lender.pid,
        size(lent),
        size(lender.offer),
        bar(lent, lender.offer, lender.offer),
        if to.is_empty() { String::new() } else { format!("  to {}", to.join(", ")) }
    )
}

/// A pool's heading: where it is, what is used and budgeted of it, and the bar.
pub fn pool_heading(pool: &PoolStatus) -> String {
    let place = match pool.gpu {
        Some(gpu) if pool.in_turns => format!("GPU {gpu} {} (in turns)", pool.tier.name()),
        Some(gpu) => format!("GPU {gpu} {}", pool.tier.name()),
        None => format!("node {}", pool.tier.name()),
    };
    format!(
        "{place}: {} of {} used, {} budgeted  {}",
        format_size(pool.used as usize),
        format_size(pool.capacity as usize),
        format_size(pool.budgeted as usize),
        bar(pool.used, pool.budgeted, pool.capacity)
    )
}

/// What the GPU's driver counts of a GPU's HBM pool (the daemon's census through NVML), in
/// one line: what is used, and by whom.
pub fn driver_line(pool: &PoolStatus) -> Option<String> {
    let d = pool.driver.as_ref()?;
    let size = |bytes: u64| format_size(bytes as usize);
    let used = format!("driver: {} of {} used", size(d.used), size(d.total));
    Some(match &d.note {
        Some(note) => format!("{used}; {note}"),
        None => format!(
            "{used}: tenants' chunks {}, their processes' contexts and other allocations {}, other processes {}",
            size(pool.used),
            size(d.overhead),
            size(d.others)
        ),
    })
}

/// The columns of a pool's tenant rows, and one tenant's cells in them (its marks last:
/// [`marks`]).
pub const SHARE_COLUMNS: [&str; 11] =
    ["tenant", "name", "pid", "w", "used / budget", "used", "budget", "target", "lent", "borrowed", ""];

pub fn share_cells(share: &ShareStatus, tenants: &[TenantStatus], pool: &PoolStatus) -> [String; 11] {
    let tenant = tenants.iter().find(|t| t.tenant == share.tenant);
    [
        share.tenant.to_string(),
        tenant.map_or("?".into(), |t| t.name.clone()),
        tenant.map_or(0, |t| t.pid).to_string(),
        tenant.map_or(0, |t| t.weight).to_string(),
        bar(share.used, share.budget, pool.capacity),
        format_size(share.used as usize),
        format_size(share.budget as usize),
        format_size(share.target as usize),
        format_size(share.lent as usize),
        format_size(share.borrowed as usize),
        marks(share, tenant),
    ]
}

/// A tenant row's last cell: `LATE`, `IDLE`, `RAMP`, `WAIT`, `HOLD` (its launches held for
/// its turn: a program under `tiermem run`), `TURN 12s` (what is left of its turn while
/// another waits) as they apply, and the memory it holds ready beyond its use
/// (`+512.00 MiB ready`: host memory pinned ahead for evictions).
fn marks(share: &ShareStatus, tenant: Option<&TenantStatus>) -> String {
    let flags = [
        (tenant.is_some_and(|t| t.late), "LATE"),
        (tenant.is_some_and(|t| t.idle), "IDLE"),
        (tenant.is_some_and(|t| t.ramping), "RAMP"),
        (tenant.is_some_and(|t| t.waiting), "WAIT"),
        (tenant.is_some_and(|t| t.held), "HOLD"),
    ];
    let mut out: Vec<String> = flags.iter().filter(|(on, _)| *on).map(|(_, mark)| (*mark).to_owned()).collect();
    if let Some(left) = tenant.and_then(|t| t.turn_left_ms) {
        out.push(format!("TURN {}s", left.div_ceil(1000)));
    }
    if share.reserved > 0 {
        out.push(format!("+{} ready", format_size(share.reserved as usize)));
    }
    out.join(" ")
}

fn render_pool(pool: &PoolStatus, tenants: &[TenantStatus]) -> String {
    let row = |c: &[String; 11]| {
        let late = if c[10].is_empty() { String::new() } else { format!("  {}", c[10]) };
        format!(
            "  {:>6} {:<12} {:>8} {:>3}  {:<26} {:>11} {:>11} {:>11} {:>11} {:>11}{late}\n",
            c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9]
        )
    };
    let mut out = format!("\n{}\n", pool_heading(pool));
    if let Some(line) = driver_line(pool) {
        out += &format!("{line}\n");
    }
    out += &row(&SHARE_COLUMNS.map(String::from));
    for share in &pool.shares {
        out += &row(&share_cells(share, tenants, pool));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_show_use_within_budget_on_the_capacity_scale() {
        assert_eq!(bar(0, 0, 100), format!("[{}]", " ".repeat(BAR)));
        assert_eq!(bar(25, 50, 100), format!("[{}{}{}]", "#".repeat(6), "=".repeat(6), " ".repeat(12)));
        assert_eq!(bar(100, 50, 100), format!("[{}]", "#".repeat(BAR)), "over budget: all used");
    }

    #[test]
    fn a_row_shows_what_a_tenant_holds_ready_beyond_its_use() {
        let mut share = ShareStatus {
            tenant: 1,
            used: 1 << 30,
            acquired: 0,
            demand: 1 << 30,
            budget: 2 << 30,
            target: 2 << 30,
            entitled: 2 << 30,
            lent: 0,
            borrowed: 0,
            reserved: 0,
        };
        assert_eq!(marks(&share, None), "");
        share.reserved = 512 << 20;
        assert_eq!(marks(&share, None), "+512.00 MiB ready");
        // A program waiting for its turn, its launches held.
        let held = TenantStatus { waiting: true, held: true, ..a_tenant() };
        assert_eq!(marks(&share, Some(&held)), "WAIT HOLD +512.00 MiB ready");
        // The one whose turn it is, while another waits: what is left of it, rounded up.
        let in_turn = TenantStatus { turn_left_ms: Some(11_200), ..a_tenant() };
        assert_eq!(marks(&share, Some(&in_turn)), "TURN 12s +512.00 MiB ready");
    }

    /// A tenant in no particular state.
    fn a_tenant() -> TenantStatus {
        TenantStatus {
            tenant: 1,
            name: "job".into(),
            pid: 1,
            uid: 0,
            cgroup: None,
            label: None,
            gpu: 0,
            job: None,
            weight: 1,
            priority: 0,
            connected_ms: 0,
            late: false,
            idle: false,
            ramping: false,
            waiting: false,
            held: false,
            turn_left_ms: None,
            overhead: None,
            host_pinned: 0,
            host_ready: 0,
            transfers: Default::default(),
        }
    }

    #[test]
    fn pinned_host_memory_is_shown_per_tenant_with_what_is_ready() {
        let tenant = |id: u64, pinned: u64, ready: u64| TenantStatus {
            tenant: id,
            host_pinned: pinned,
            host_ready: ready,
            ..a_tenant()
        };
        let mut report = StatusReport { tenants: vec![tenant(1, 0, 0)], ..StatusReport::default() };
        assert_eq!(host_pinned_line(&report), None, "nothing pinned: no line");
        report.tenants.push(tenant(2, 3 << 30, 1 << 30));
        report.tenants.push(tenant(3, 1 << 30, 0));
        assert_eq!(
            host_pinned_line(&report).as_deref(),
            Some("\npinned host memory: tenant 2 (job) 3.00 GiB, 1.00 GiB of it ready; tenant 3 (job) 1.00 GiB\n")
        );
        assert!(render(&report).contains("pinned host memory: tenant 2"));
        assert!(!render(&report).contains("traffic"), "nothing moved: no traffic rows");
        report.tenants[1].transfers =
            TransferCounters { bytes_in: 3 << 30, bytes_out: 1 << 30, stall_us: 2_500_000, ..Default::default() };
        report.tenants[2].transfers =
            TransferCounters { launches: 200, launches_all_in_hbm: 190, ..Default::default() };
        let shown = render(&report);
        assert!(shown.contains("traffic since each tenant started:"), "{shown}");
        let rows: Vec<&str> = shown.lines().filter(|l| l.contains(" job ")).collect();
        let row_of = |id: &str| rows.iter().rev().find(|l| l.trim_start().starts_with(id)).copied().unwrap_or("");
        assert!(
            row_of("2 ").contains("3.00 GiB") && row_of("2 ").contains("2.5 s") && row_of("2 ").ends_with("-"),
            "{shown}"
        );
        assert!(
            row_of("3 ").contains("200") && row_of("3 ").ends_with("95.0%"),
            "launches and their share all in HBM: {shown}"
        );
    }
}
