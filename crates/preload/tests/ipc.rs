//! Legacy CUDA IPC on tiermem's memory (docs/transparent.md, "IPC handles"): a handle made by
//! `cuIpcGetMemHandle` for an allocation of tiermem's opens in another process under the
//! preload, which reads what the exporter wrote and writes what the exporter then reads; the
//! shared allocation no longer moves; a handle whose allocation was freed, or garbage, is
//! refused with the driver's error and holds nothing; nothing leaks on either side. And what a
//! pointer says of its allocation (`cuMemGetAddressRange`, `cuPointerGetAttribute`).

mod support;

/// A budget of 16 MiB, migration at every synchronization, `--stats`.
const ENV: [(&str, &str); 4] = [
    ("TIERMEM_HBM_LIMIT", "16MiB"),
    ("TIERMEM_FAKE_HBM", "256M"),
    ("TIERMEM_MIGRATE_INTERVAL_MS", "0"),
    ("TIERMEM_STATS", "1"),
];

#[test]
fn a_tiermem_allocation_is_shared_with_another_process_by_a_legacy_handle() {
    let output = support::probe("ipc", &["ipc"], &ENV);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("ipc: ok"), "{stdout}\n{stderr}");
    assert!(stderr.contains("freed the allocation"), "the refused open says why: {stderr}");
    // The parent shared B and, at the end, C; each child that opened B says so (stats at exit).
    assert!(stderr.contains("IPC handles: 2 allocation(s) shared with other processes"), "{stderr}");
    assert!(
        stderr.contains("IPC handles: 0 allocation(s) shared with other processes (never moved since), 1 opened"),
        "{stderr}"
    );
}

#[test]
fn no_library_takes_the_physical_memory_of_tiermems_allocations() {
    let output = support::probe("retain", &["retain"], &ENV);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("retain: ok"), "{stdout}\n{stderr}");
}

#[test]
fn a_pointer_into_tiermem_memory_reports_the_allocation_the_program_made() {
    let output = support::probe("ranges", &["ranges"], &[("TIERMEM_HBM_LIMIT", "16MiB")]);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("ranges: ok"), "{stdout}\n{stderr}");
}
