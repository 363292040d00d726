//! Several threads allocating, writing, reading back and freeing at once under a small budget,
//! so that their allocations land in HBM and on the host by turns.

mod support;

#[test]
fn threads_share_the_budget_and_keep_their_bytes() {
    let env = [("TIERMEM_HBM_LIMIT", "16MiB"), ("TIERMEM_STATS", "1")];
    let output = support::probe("threads", &["threads"], &env);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("threads: ok"), "{stdout}");
    assert!(stderr.contains("tiermem: stats: 80 allocations ("), "{stderr}");
    assert!(stderr.contains("0 refused), 0 live at exit"), "{stderr}");
}
