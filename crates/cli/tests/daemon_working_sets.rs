//! Three tenant processes whose working sets do not all fit, under a daemon with
//! `hbm_sharing = "working-sets"`: one runs with its whole working set while the other two keep
//! a little and wait, the turn passes to another after `turn_ms`, every engine keeps to its
//! budget and every byte is verified.

mod support;
use support::*;
use tiermem_protocol::StatusReport;

#[test]
fn one_whole_working_set_at_a_time_and_turns_pass() {
    let dir = TempDir::new("working-sets");
    let _daemon = start_daemon(
        &dir,
        "hbm_sharing = \"working-sets\"\nturn_ms = 1500\nidle_after_ms = 0\n[[gpu]]\nindex = 0\nhbm = \"96MiB\"\n",
    );
    let args = ["--working-set", "56MiB", "--seconds", "600"];
    let tenants: Vec<Process> = (0..3).map(|_| start_tenant(&dir, None, &args)).collect();
    // Once every tenant has allocated its working set: the one running whole, if exactly one
    // does and the two others wait with a little each (from one status report).
    let running = |report: &StatusReport| -> Option<u64> {
        let shares = hbm_shares(report);
        let allocated = shares.len() == 3 && shares.iter().all(|(_, s)| s.demand >= 56 * MIB);
        let whole: Vec<u64> = shares
            .iter()
            .filter(|(_, s)| s.budget >= 56 * MIB && s.budget == s.target)
            .map(|(_, s)| s.tenant)
            .collect();
        let small = shares.iter().filter(|(_, s)| s.budget < 56 * MIB && s.budget >= 8 * MIB).count();
        let waiting: Vec<u64> = report.tenants.iter().filter(|t| t.waiting).map(|t| t.tenant).collect();
        let one = allocated && whole.len() == 1 && small == 2 && waiting.len() == 2 && !waiting.contains(&whole[0]);
        one.then(|| whole[0])
    };
    let mut first = None;
    wait_for("one whole working set, two waiting", || {
        first = status(&dir.socket()).and_then(|r| running(&r));
        first.is_some()
    });
    // After its turn another tenant runs whole.
    wait_for("the turn passed to another tenant", || {
        status(&dir.socket()).and_then(|r| running(&r)).is_some_and(|t| Some(t) != first)
    });
    // Each engine meets its budget.
    wait_for_shares(&dir.socket(), "every tenant within its budget", |shares| {
        shares.len() == 3 && shares.iter().all(|(_, s)| s.used <= s.budget && s.used > 0)
    });
    let reports = stop_and_verify(&dir, tenants);
    assert!(reports.iter().all(|r| r["rounds"].as_u64().unwrap() >= 1));
}
