//! Facts about the machine for the report: the kernel's counters (/proc/vmstat) and the
//! settings that shape swapping.

use super::read_trim;
use super::zswap::ZSWAP;
use std::collections::HashMap;

/// Counters of /proc/vmstat.
pub fn vmstat() -> HashMap<String, u64> {
    std::fs::read_to_string("/proc/vmstat")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter_map(|(k, v)| Some((k.to_string(), v.trim().parse().ok()?)))
        .collect()
}

/// The kernel settings that shape swapping, as they were during the run.
pub fn settings() -> serde_json::Value {
    let read = |p: &str| read_trim(p).map_or(serde_json::Value::Null, serde_json::Value::String);
    serde_json::json!({
        "kernel": read("/proc/sys/kernel/osrelease"),
        "vm.swappiness": read("/proc/sys/vm/swappiness"),
        "vm.page-cluster": read("/proc/sys/vm/page-cluster"),
        "vm.min_free_kbytes": read("/proc/sys/vm/min_free_kbytes"),
        "transparent_hugepage": read("/sys/kernel/mm/transparent_hugepage/enabled"),
        "zswap": read(ZSWAP),
        "io_uring_disabled": read("/proc/sys/kernel/io_uring_disabled"),
        "hung_task_timeout_secs": read("/proc/sys/kernel/hung_task_timeout_secs"),
        "mem_total_kib": read_trim("/proc/meminfo").and_then(|m| m.lines().next().map(|l| l.split_whitespace().nth(1).unwrap_or("").to_string())),
    })
}
