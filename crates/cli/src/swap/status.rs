//! `tiermem swap status`: the server's report, as text or JSON, with the devices' lines of
//! /proc/swaps.

use super::args::SwapStatusArgs;
use super::{optional, size};
use serde_json::{json, Value};
use tiermem_swap::control::{self, RunDir, StatusReport};

pub(super) fn status(args: SwapStatusArgs) -> Result<(), String> {
    let run = RunDir::from_env();
    if !run.server_running() {
        return match run.read_state() {
            Some(state) => {
                if args.json {
                    println!("{}", json!({"running": false, "stale": state}));
                }
                Err(format!(
                    "off, but the server (pid {}) died and left its devices behind: run `tiermem swap off` to clean up",
                    state.pid
                ))
            }
            None => {
                if args.json {
                    println!("{}", json!({"running": false}));
                } else {
                    println!("tiermem swap: off");
                }
                Ok(())
            }
        };
    }
    let report = control::status(&run.socket()).map_err(|e| format!("asking the server: {e}"))?;
    if args.json {
        let mut value = serde_json::to_value(&report).map_err(|e| e.to_string())?;
        value["running"] = json!(true);
        println!("{}", serde_json::to_string_pretty(&value).map_err(|e| e.to_string())?);
    } else {
        print!("{}", render(&report));
    }
    Ok(())
}

fn render(r: &StatusReport) -> String {
    let mut out = format!(
        "tiermem swap: on, pid {}, up {:.0} s: {} on {} devices, {}\n",
        r.pid,
        r.uptime_s,
        size(r.size_bytes),
        r.devices.len(),
        if r.swap_enabled { format!("swap at priority {}", r.priority) } else { "not swap".into() }
    );
    let s = &r.store;
    out += &format!("store: {}\n", s.backend);
    out += &format!(
        "  present {}: HBM {}, host {}, file {}\n  limits in free VRAM: soft {}, hard {}; cap {}; gave back {} times, {}\n",
        size(s.present_bytes),
        size(s.hbm_bytes),
        size(s.host_bytes),
        size(s.file_bytes),
        optional(s.soft_limit_bytes),
        optional(s.hard_limit_bytes),
        optional(s.cap_bytes),
        s.give_backs,
        size(s.given_back_bytes)
    );
    if let Some(daemon) = &s.daemon {
        out += &match (daemon["connected"].as_bool(), daemon["tenant"].as_u64()) {
            (Some(true), Some(tenant)) => {
                format!("  node daemon: tenant {tenant}, HBM budget {}\n", optional(daemon["budget_bytes"].as_u64()))
            }
            _ => "  node daemon: not connected (keeping the last budget)\n".to_string(),
        };
    }
    let d = &s.detail;
    if let (Some(free), Some(total)) = (d["gpu"]["free"].as_u64(), d["gpu"]["total"].as_u64()) {
        out += &format!(
            "  GPU: {} free of {}; {}; HBM budget {}\n",
            size(free),
            size(total),
            d["pressure"].as_str().unwrap_or("?"),
            optional(d["hbm_budget"].as_u64())
        );
    }
    if let Some(last) = d["give_backs"]["last"].as_object() {
        let before = last.get("held_before").and_then(Value::as_u64).unwrap_or(0);
        let after = last.get("held_after").and_then(Value::as_u64).unwrap_or(0);
        let seconds = last.get("seconds").and_then(Value::as_f64).unwrap_or(0.0);
        out += &format!("  last give-back: {} in {seconds:.3} s\n", size(before.saturating_sub(after)));
    }
    if let Some(error) = d["last_monitor_error"].as_str() {
        out += &format!("  monitor: {} failed steps, last: {error}\n", d["monitor_errors"]);
    }
    out += "devices:\n";
    for d in &r.devices {
        let swap = d.swap.as_ref().map_or("not swap".into(), |a| {
            format!("swap: {} used of {}, priority {}", size(a.used_bytes), size(a.size_bytes), a.priority)
        });
        out += &format!(
            "  {:<12} {}  {}  {swap}\n",
            d.loop_device.as_deref().unwrap_or("-"),
            d.file.display(),
            size(d.size_bytes)
        );
    }
    if let Some(q) = &r.requests {
        let op = |name: &str, o: &tiermem_swap::fuse_server::OpReport| {
            let latency = match (o.mean_us, o.p50_us, o.p99_us) {
                (Some(mean), Some(p50), Some(p99)) => format!("mean {mean:.1} µs, p50 ≤{p50} µs, p99 ≤{p99} µs"),
                _ => String::new(),
            };
            format!("  {name:<9}{:>10}  {:>11}  {latency}\n", o.count, size(o.bytes))
        };
        out += "requests:\n";
        out += &op("reads", &q.reads);
        out += &op(" in store", &q.reads_in_store);
        out += &op("writes", &q.writes);
        out += &op("discards", &q.discards);
        out += &format!("  errors {}, buffers allocated on the I/O path {}\n", q.errors, q.buffer_allocations);
    }
    let f = &r.fuse;
    out += &format!(
        "FUSE: ABI {}, async direct I/O {}, max write {}, {} threads, mounted at {}\n",
        f.abi,
        if f.async_dio { "on" } else { "off" },
        size(f.max_write as u64),
        r.process.fuse_threads,
        r.mountpoint.display()
    );
    let p = &r.process;
    out += &format!(
        "process: locked {}, PR_SET_IO_FLUSHER {}, oom_score_adj {}, cgroup {}\n",
        optional(p.locked_bytes),
        p.io_flusher,
        p.oom_score_adj,
        p.cgroup
    );
    let lines: Vec<String> = std::fs::read_to_string("/proc/swaps")
        .unwrap_or_default()
        .lines()
        .enumerate()
        .filter(|(i, line)| {
            *i == 0
                || r.devices
                    .iter()
                    .any(|d| d.loop_device.as_deref().is_some_and(|l| line.split_whitespace().next() == Some(l)))
        })
        .map(|(_, line)| format!("  {line}"))
        .collect();
    if lines.len() > 1 {
        out += &format!("/proc/swaps:\n{}\n", lines.join("\n"));
    }
    out
}
