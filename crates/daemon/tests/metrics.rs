//! Prometheus metrics: `GET /metrics` shows pools, budgets, tenants' use and transfers, and
//! how long cuts took to be met, every metric the Grafana dashboard queries among them; other
//! paths are 404.

mod support;
use std::io::{Read, Write};
use support::*;
use tiermem_protocol::*;

fn get(address: std::net::SocketAddr, path: &str) -> String {
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

#[test]
fn metrics_show_budgets_use_transfers_and_reclaims() {
    let (path, address) = start_daemon("metrics", true);
    let address = address.unwrap();
    let (mut a, mut ra) = connect(&path);
    register(&mut a, &mut ra);
    let usage = TierUsage { used: 10 << 20, acquired: 2 << 20, demand: 1 << 30, reserved: 4 << 20 };
    let transfers = TransferCounters {
        bytes_in: 123 << 20,
        bytes_out: 45 << 20,
        evictions: 7,
        stall_us: 900,
        launches: 40,
        launches_all_in_hbm: 30,
        ..TransferCounters::default()
    };
    let report = ClientMessage::Usage {
        hbm: usage,
        host: TierUsage::default(),
        file: TierUsage::default(),
        peer: TierUsage::default(),
        transfers,
    };
    write_message(&mut a, &report).unwrap();
    let (mut b, mut rb) = connect(&path);
    register(&mut b, &mut rb);
    // A is cut to half and meets it: one reclaim of 32 MiB.
    let cut = loop {
        if let DaemonMessage::Budget { seq, tiers, .. } = ra.wait(deadline()).unwrap() {
            if tiers[0].bytes == 32 << 20 {
                break seq;
            }
        }
    };
    write_message(&mut a, &ClientMessage::BudgetMet { seq: cut }).unwrap();
    let DaemonMessage::Budget { .. } = rb.wait(deadline()).unwrap() else { panic!("B grows") };

    let text = get(address, "/metrics");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    for expected in [
        r#"tiermem_pool_capacity_bytes{tier="hbm",gpu="0"} 67108864"#,
        r#"tiermem_tenant_budget_bytes{tier="hbm",gpu="0",tenant="1",name="default"} 33554432"#,
        r#"tiermem_tenant_used_bytes{tier="hbm",gpu="0",tenant="1",name="default"} 10485760"#,
        r#"tiermem_tenant_acquired_bytes{tier="hbm",gpu="0",tenant="1",name="default"} 2097152"#,
        r#"tiermem_tenant_reserved_bytes{tier="hbm",gpu="0",tenant="1",name="default"} 4194304"#,
        r#"tiermem_tenant_page_in_bytes_total{tenant="1",name="default"} 128974848"#,
        r#"tiermem_tenant_evictions_total{tenant="1",name="default"} 7"#,
        r#"tiermem_tenant_launches_total{tenant="1",name="default"} 40"#,
        r#"tiermem_tenant_launches_all_in_hbm_total{tenant="1",name="default"} 30"#,
        r#"tiermem_tenants{name="default"} 2"#,
        // Both just arrived: ramping up, neither late nor idle.
        r#"tiermem_tenant_state{tenant="2",name="default",state="ramping"} 1"#,
        r#"tiermem_tenant_state{tenant="1",name="default",state="late"} 0"#,
        r#"tiermem_tenant_state{tenant="1",name="default",state="idle"} 0"#,
        r#"tiermem_tenant_state{tenant="1",name="default",state="held"} 0"#,
        // Engines (not programs that can wait): fair share, not turns.
        r#"tiermem_gpu_in_turns{gpu="0"} 0"#,
        "tiermem_reclaim_seconds_count 1",
        "tiermem_reclaimed_bytes_total 33554432",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in\n{text}");
    }
    // Every metric the Grafana dashboard (deploy/) queries is one the daemon registers (those
    // of lenders and of the driver's census appear once there are some).
    let dashboard = include_str!("../../../deploy/grafana-dashboard.json");
    let registered = include_str!("../src/metrics.rs");
    let queried: Vec<&str> = dashboard
        .match_indices("tiermem_")
        .map(|(at, _)| {
            let name = &dashboard[at + "tiermem_".len()..];
            &name[..name.find(|c: char| !(c.is_ascii_lowercase() || c == '_')).unwrap_or(name.len())]
        })
        .collect();
    assert!(queried.len() >= 15 && queried.contains(&"tenant_state"), "{queried:?}");
    for name in queried {
        let family = ["_total", "_bucket"].iter().fold(name, |n, suffix| n.strip_suffix(suffix).unwrap_or(n));
        assert!(
            registered.contains(&format!("\"{family}\"")),
            "the dashboard queries tiermem_{name}, which the daemon does not register"
        );
    }
    assert!(get(address, "/").starts_with("HTTP/1.1 404"));
}
