//! `tiermem top`: what `tiermem status` shows, refreshed live in the terminal (ratatui over
//! crossterm). `q`, `Esc` or `Ctrl-C` quits; the terminal is restored on exit and on panic.
//! While the daemon does not answer, the last report stays on screen with the reason. Each
//! tenant's traffic is shown per second, from the counters of the report before.

use crate::node::{
    any_traffic, bar, driver_line, pool_heading, share_cells, traffic_cells, SHARE_COLUMNS, TRAFFIC_COLUMNS,
};
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Row, Table};
use ratatui::Frame;
use std::path::PathBuf;
use std::time::Duration;
use tiermem::format_size;
use tiermem_protocol::{LenderStatus, PoolStatus, StatusReport};

#[derive(clap::Args)]
pub struct TopArgs {
    /// The daemon's socket (default: as tenants find it, TIERMEM_SOCKET first).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Milliseconds between refreshes.
    #[arg(long, default_value_t = 500)]
    interval_ms: u64,
}

pub fn run(args: TopArgs) -> Result<(), String> {
    let socket = crate::node::socket_of_daemon(args.socket)?;
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() {
        return Err("top: needs a terminal to draw in (standard output is not one): `tiermem status` prints once, `tiermem status --json` for scripts".into());
    }
    let mut terminal = ratatui::try_init()
        .map_err(|e| format!("top: the terminal: {e} (`tiermem status` prints once, without one)"))?;
    let (mut last, mut before): (Option<StatusReport>, Option<StatusReport>) = (None, None);
    let outcome = loop {
        let problem = match tiermem_tenant::query_status(&socket) {
            Ok(report) => {
                before = last.replace(report);
                None
            }
            Err(e) => Some(e.to_string()),
        };
        let shown = Shown { report: last.as_ref(), before: before.as_ref(), problem: problem.as_deref() };
        if let Err(e) = terminal.draw(|frame| draw(frame, &shown)) {
            break Err(format!("top: drawing: {e}"));
        }
        match quit_requested(Duration::from_millis(args.interval_ms.max(50))) {
            Ok(true) => break Ok(()),
            Ok(false) => {}
            Err(e) => break Err(format!("top: reading keys: {e}")),
        }
    };
    ratatui::restore();
    outcome
}

/// Waits up to `wait` for a key; whether it asks to quit.
fn quit_requested(wait: Duration) -> std::io::Result<bool> {
    if !event::poll(wait)? {
        return Ok(false);
    }
    Ok(match event::read()? {
        Event::Key(key) if key.kind == KeyEventKind::Press => {
            matches!(key.code, KeyCode::Char('q') | KeyCode::Esc)
                || (key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL))
        }
        _ => false,
    })
}

/// What a refresh shows: the latest report, the one before it (for rates), and why the daemon
/// did not answer, if it did not.
struct Shown<'a> {
    report: Option<&'a StatusReport>,
    before: Option<&'a StatusReport>,
    problem: Option<&'a str>,
}

fn draw(frame: &mut Frame, shown: &Shown) {
    let (report, problem) = (shown.report, shown.problem);
    let pools = report.map_or(&[][..], |r| &r.pools[..]);
    let lenders = report.map_or(&[][..], |r| &r.lenders[..]);
    let tenants = report.map_or(&[][..], |r| &r.tenants[..]);
    let heights = pools.iter().map(|p| Constraint::Length(p.shares.len() as u16 + 3));
    let lenders_height = if lenders.is_empty() { 0 } else { lenders.len() as u16 + 3 };
    let traffic_height = if any_traffic(tenants) { tenants.len() as u16 + 3 } else { 0 };
    let areas = Layout::vertical(std::iter::once(Constraint::Length(1)).chain(heights).chain([
        Constraint::Length(lenders_height),
        Constraint::Length(traffic_height),
        Constraint::Min(0),
    ]))
    .split(frame.area());
    let header = match (report, problem) {
        (_, Some(problem)) => format!("tiermem top: {problem} (q quits)"),
        (Some(r), None) => format!(
            "{} | up {:.0} s | {} tenants{} | q quits",
            r.daemon,
            r.uptime_ms as f64 / 1000.0,
            r.tenants.len(),
            if r.hidden_tenants > 0 { format!(" ({} not shown to you)", r.hidden_tenants) } else { String::new() }
        ),
        (None, None) => "tiermem top".into(),
    };
    frame.render_widget(Line::from(header).style(Style::new().add_modifier(Modifier::BOLD)), areas[0]);
    for (pool, area) in pools.iter().zip(&areas[1..]) {
        frame.render_widget(pool_table(pool, report.map_or(&[][..], |r| &r.tenants[..])), *area);
    }
    if !lenders.is_empty() {
        frame.render_widget(lender_table(lenders), areas[pools.len() + 1]);
    }
    if let (Some(report), true) = (report, traffic_height > 0) {
        frame.render_widget(traffic_table(report, shown.before), areas[pools.len() + 2]);
    }
}

/// Each tenant's traffic per second since the report `before` (since it started, on the first
/// refresh or for a tenant new since then).
fn traffic_table<'a>(report: &'a StatusReport, before: Option<&'a StatusReport>) -> Table<'a> {
    let seconds = before.map_or(0.0, |b| report.uptime_ms.saturating_sub(b.uptime_ms) as f64 / 1e3);
    let rows = report.tenants.iter().map(|t| {
        let earlier = before
            .and_then(|b| b.tenants.iter().find(|e| e.tenant == t.tenant))
            .filter(|_| seconds > 0.0)
            .map(|e| (&e.transfers, seconds));
        Row::new(traffic_cells(t, earlier))
    });
    let header = Row::new(TRAFFIC_COLUMNS).style(Style::new().add_modifier(Modifier::UNDERLINED));
    let widths = [6, 12, 14, 14, 10, 10, 10].map(Constraint::Length);
    let title = if seconds > 0.0 { " traffic per second " } else { " traffic since each tenant started " };
    Table::new(rows, widths).header(header).block(Block::new().borders(Borders::ALL).title(title))
}

/// The lenders (`tiermem lend`): each one's offer, what it lends (bar: lent of offered), to whom.
fn lender_table(lenders: &[LenderStatus]) -> Table<'_> {
    let size = |bytes: u64| format_size(bytes as usize);
    let rows = lenders.iter().map(|l| {
        let lent: u64 = l.lent.iter().map(|(_, bytes)| bytes).sum();
        let to: Vec<String> = l.lent.iter().map(|(tenant, bytes)| format!("{tenant}: {}", size(*bytes))).collect();
        Row::new([
            l.gpu.to_string(),
            l.lender.to_string(),
            l.pid.to_string(),
            size(l.offer),
            size(lent),
            bar(lent, l.offer, l.offer),
            size(l.returning),
            to.join(", "),
        ])
    });
    let header = Row::new(["GPU", "lender", "pid", "offer", "lent", "", "returning", "to tenants"])
        .style(Style::new().add_modifier(Modifier::UNDERLINED));
    let widths = [4, 7, 8, 11, 11, 26, 10, 40].map(Constraint::Length);
    Table::new(rows, widths).header(header).block(Block::new().borders(Borders::ALL).title(" lenders "))
}

fn pool_table<'a>(pool: &'a PoolStatus, tenants: &'a [tiermem_protocol::TenantStatus]) -> Table<'a> {
    let title = format!(" {} ", pool_heading(pool));
    let rows = pool.shares.iter().map(|share| Row::new(share_cells(share, tenants, pool)));
    let header = Row::new(SHARE_COLUMNS).style(Style::new().add_modifier(Modifier::UNDERLINED));
    let widths = [6, 12, 8, 3, 26, 11, 11, 11, 11, 11, 24].map(Constraint::Length);
    let mut block = Block::new().borders(Borders::ALL).title(title);
    if let Some(line) = driver_line(pool) {
        block = block.title_bottom(format!(" {line} "));
    }
    Table::new(rows, widths).header(header).block(block)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::backend::TestBackend;
    use tiermem_protocol::{ShareStatus, TenantStatus, Tier};

    #[test]
    fn the_screen_shows_each_pool_and_tenant() {
        let share = ShareStatus {
            tenant: 3,
            used: 8 << 20,
            acquired: 0,
            demand: 64 << 20,
            budget: 16 << 20,
            target: 16 << 20,
            entitled: 32 << 20,
            lent: 0,
            borrowed: 0,
            reserved: 0,
        };
        let tenant = TenantStatus {
            tenant: 3,
            name: "training".into(),
            pid: 4242,
            uid: 0,
            cgroup: None,
            label: None,
            gpu: 0,
            job: None,
            weight: 2,
            priority: 0,
            connected_ms: 10,
            late: true,
            idle: true,
            ramping: true,
            waiting: true,
            held: true,
            turn_left_ms: None,
            overhead: Some(600 << 20),
            host_pinned: 0,
            host_ready: 0,
            transfers: tiermem_protocol::TransferCounters {
                bytes_in: 3 << 30,
                bytes_out: 1 << 30,
                stall_us: 250_000,
                launches: 1000,
                launches_all_in_hbm: 950,
                ..Default::default()
            },
        };
        let pool = PoolStatus {
            tier: Tier::Hbm,
            gpu: Some(0),
            capacity: 64 << 20,
            budgeted: 16 << 20,
            used: 8 << 20,
            shares: vec![share],
            driver: Some(tiermem_protocol::DriverAccounts {
                total: 1 << 30,
                used: 1000 << 20,
                others: 392 << 20,
                overhead: 600 << 20,
                note: None,
            }),
            in_turns: true,
        };
        let report = StatusReport {
            daemon: "tiermemd test".into(),
            uptime_ms: 5000,
            pools: vec![pool],
            tenants: vec![tenant],
            hidden_tenants: 1,
            lenders: vec![LenderStatus {
                lender: 9,
                pid: 555,
                gpu: 1,
                offer: 8 << 30,
                lent: vec![(3, 2 << 30)],
                returning: 0,
            }],
        };
        let mut earlier = report.clone();
        earlier.uptime_ms -= 1000;
        earlier.tenants[0].transfers.bytes_in -= 1 << 30;
        earlier.tenants[0].transfers.launches -= 100;
        earlier.tenants[0].transfers.launches_all_in_hbm -= 50;
        let mut terminal = ratatui::Terminal::new(TestBackend::new(160, 20)).unwrap();
        let shown = Shown { report: Some(&report), before: Some(&earlier), problem: None };
        terminal.draw(|frame| draw(frame, &shown)).unwrap();
        let screen: String = terminal.backend().buffer().content().iter().map(|cell| cell.symbol()).collect();
        let expected = [
            "tiermemd test",
            "1 not shown to you",
            "GPU 0 hbm (in turns)",
            "training",
            "4242",
            "16.00 MiB",
            "LATE IDLE RAMP WAIT HOLD",
            "other processes 392",
            "lenders",
            "8.00 GiB",
            "3: 2.00 GiB",
            "traffic per second",
            "1.00 GiB/s",
            "100/s",
            "50.0%",
        ];
        for expected in expected {
            assert!(screen.contains(expected), "{expected:?} missing from the screen:\n{screen}");
        }
    }
}
