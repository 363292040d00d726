//! Three tenant processes whose working sets do not all fit, under a daemon with
//! `hbm_sharing = "working-sets"`: one runs with its whole working set while the other two keep
//! a little and wait, the turn passes to another after `turn_ms`, every engine keeps to its
//! budget and every byte is verified.

mod support;
use support::*;

#[test]
fn one_whole_working_set_at_a_time_and_turns_pass() {
    let dir = TempDir::new("working-sets");
    let _daemon = start_daemon(
        &dir,
        "hbm_sharing = \"working-sets\"\nturn_ms = 1500\nidle_after_ms = 0\n[[gpu]]\nindex = 0\nhbm = \"96MiB\"\n",
    );
    let args = ["--working-set", "56MiB", "--seconds", "600"];
    let tenants: Vec<Process> = (0..3).map(|_| start_tenant(&dir, None, &args)).collect();
    let whole = |shares: &[(String, tiermem_protocol::ShareStatus)]| {
        let running: Vec<u64> = shares
            .iter()
            .filter(|(_, s)| s.budget >= 56 * MIB && s.budget == s.target)
            .map(|(_, s)| s.tenant)
            .collect();
        let small = shares.iter().filter(|(_, s)| s.budget < 56 * MIB && s.budget >= 8 * MIB).count();
        (shares.len() == 3 && running.len() == 1 && small == 2).then(|| running[0])
    };
    let first = whole(&wait_for_shares(&dir.socket(), "one whole working set, two waiting", |s| whole(s).is_some()))
        .expect("one tenant whole");
    let report = status(&dir.socket()).expect("status");
    let waiting: Vec<u64> = report.tenants.iter().filter(|t| t.waiting).map(|t| t.tenant).collect();
    assert_eq!(waiting.len(), 2, "{report:#?}");
    assert!(!waiting.contains(&first));
    // After its turn another tenant runs whole.
    wait_for_shares(&dir.socket(), "the turn passed to another tenant", |s| whole(s).is_some_and(|t| t != first));
    // Each engine meets its budget.
    wait_for_shares(&dir.socket(), "every tenant within its budget", |shares| {
        shares.len() == 3 && shares.iter().all(|(_, s)| s.used <= s.budget && s.used > 0)
    });
    let reports = stop_and_verify(&dir, tenants);
    assert!(reports.iter().all(|r| r["rounds"].as_u64().unwrap() >= 1));
}
