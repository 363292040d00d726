//! Neighbours' HBM beyond the budget (spill.rs), over the fake driver with two GPUs: with
//! `TIERMEM_PEERS` naming GPU 1, what does not fit in GPU 0's budget goes to GPU 1 while it lends
//! room, then to the host, and moves down take GPU 1's chunks first, every byte intact and
//! everything given back; without `TIERMEM_PEERS` a second GPU lends nothing; a bad setting is
//! said on stderr and costs the program nothing.

mod support;

const ENV: [(&str, &str); 4] = [
    ("TIERMEM_HBM_LIMIT", "16MiB"),
    ("TIERMEM_FAKE_HBM", "256M"),
    ("TIERMEM_MIGRATE_INTERVAL_MS", "0"),
    ("TIERMEM_FAKE_GPUS", "2"),
];

fn with(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    ENV.iter().chain(extra).copied().collect()
}

#[test]
fn beyond_the_budget_a_lending_neighbour_comes_before_the_host() {
    let env = with(&[
        ("TIERMEM_PEERS", "1"),
        ("TIERMEM_PEER_RESERVE", "0"),
        ("TIERMEM_PEER_LIMIT", "10MiB"),
        ("TIERMEM_STATS", "1"),
        // Rounds of one chunk each way: later rounds' moves down find both the neighbour's
        // chunks (left by moves up from it) and host chunks among the spares.
        ("TIERMEM_MIGRATE_BATCH", "2MiB"),
    ]);
    let output = support::probe("neighbours", &["neighbours"], &env);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("neighbours: ok"), "{stdout}");
    assert!(
        stderr.contains("neighbours' HBM lent: GPU 1 to GPU 0: up to 10.00 MiB, peak 10.00 MiB, 0 B at exit"),
        "{stderr}"
    );
}

#[test]
fn auto_borrows_from_an_idle_neighbour() {
    let env = with(&[("TIERMEM_PEERS", "auto"), ("TIERMEM_PEER_RESERVE", "246MiB"), ("TIERMEM_STATS", "1")]);
    let output = support::probe("neighbours-auto", &["neighbours"], &env);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("neighbours: ok"), "GPU 1 (256 MiB, idle) lends all but 246 MiB: {stdout}");
    assert!(stderr.contains("GPU 1 to GPU 0: up to 10.00 MiB"), "{stderr}");
}

#[test]
fn without_peers_a_second_gpu_lends_nothing() {
    let output = support::probe("neighbours-off", &["migrate"], &with(&[]));
    let (stdout, _) = support::assert_passed(&output);
    assert!(stdout.contains("migrate: ok"), "beyond the budget is the host's, as with one GPU: {stdout}");
}

#[test]
fn a_bad_setting_is_said_and_the_host_takes_the_rest() {
    for (value, said) in [("7", "TIERMEM_PEERS names GPU 7"), ("sideways", "TIERMEM_PEERS:")] {
        let output = support::probe("neighbours-bad", &["migrate"], &with(&[("TIERMEM_PEERS", value)]));
        let (stdout, stderr) = support::assert_passed(&output);
        assert!(stdout.contains("migrate: ok"), "{stdout}");
        assert!(stderr.contains(said) && stderr.contains("no neighbour lends HBM"), "{value}: {stderr}");
    }
}

#[test]
fn a_lender_short_of_its_reserve_gets_its_memory_back_at_a_synchronization() {
    let env = with(&[
        ("TIERMEM_PEERS", "1"),
        ("TIERMEM_PEER_RESERVE", "200MiB"),
        ("TIERMEM_PEER_CHECK_MS", "0"),
        ("TIERMEM_STATS", "1"),
    ]);
    let output = support::probe("neighbours-reclaim", &["neighbours-reclaim"], &env);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("neighbours-reclaim: ok"), "{stdout}");
    assert!(stderr.contains("6.00 MiB given back to lenders short of their reserve"), "{stderr}");
}
