//! GDM §6.2 and §6.5 under the daemon: a hog (a working set of 3× the GPU) and a leaker (a
//! buffer more every round, never freed) are held to their shares while a well-behaved tenant
//! keeps what it needs; all three finish with every byte verified.

mod support;
use support::*;

#[test]
fn a_hog_and_a_leaker_are_held_to_their_shares() {
    let dir = TempDir::new("hog-leak");
    let _daemon = start_daemon(&dir, "[[gpu]]\nindex = 0\nhbm = \"96MiB\"\n");
    let modest = start_tenant(&dir, Some("modest"), &["--working-set", "24MiB", "--seconds", "600"]);
    let hog = start_tenant(&dir, Some("hog"), &["--working-set", "288MiB", "--seconds", "600"]);
    let leaker = start_tenant(&dir, Some("leaker"), &["--working-set", "8MiB", "--leak", "200MiB", "--seconds", "600"]);
    let label_of = |report: &tiermem_protocol::StatusReport, id| {
        report.tenants.iter().find(|t| t.tenant == id).and_then(|t| t.label.clone()).unwrap_or_default()
    };
    // Settled: the modest tenant has all it asks for (24 MiB, under its third); the hog and
    // the leaker split the rest, neither holding more than its budget.
    let mut leaked_past_its_share = false;
    wait_for("the modest tenant to keep its 24 MiB while the leaker grows past its share", || {
        let Some(report) = status(&dir.socket()) else { return false };
        let Some(pool) = report.pools.first() else { return false };
        let share = |label: &str| pool.shares.iter().find(|s| label_of(&report, s.tenant) == label).cloned();
        let (Some(modest), Some(hog), Some(leaker)) = (share("modest"), share("hog"), share("leaker")) else {
            return false;
        };
        assert!(pool.budgeted <= pool.capacity, "never promised twice: {pool:?}");
        leaked_past_its_share |= leaker.demand > 40 * MIB;
        let settled = [&modest, &hog, &leaker].iter().all(|s| s.budget == s.target);
        settled
            && leaked_past_its_share
            && modest.budget >= 24 * MIB
            && hog.budget <= 96 * MIB - 24 * MIB
            && leaker.budget <= 96 * MIB - 24 * MIB
            && hog.used <= hog.budget
            && leaker.used <= leaker.budget
    });
    let reports = stop_and_verify(&dir, vec![modest, hog, leaker]);
    assert!(reports[2]["buffers"].as_u64().unwrap() > 5, "the leaker leaked: {}", reports[2]);
}
