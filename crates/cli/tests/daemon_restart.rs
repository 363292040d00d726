//! The daemon restarted under load: the tenants keep their budgets and their work while it
//! is away, reconnect to the new one, and converge to its shares; every byte is verified.

mod support;
use support::*;

#[test]
fn tenants_reconnect_when_the_daemon_restarts_under_load() {
    let dir = TempDir::new("restart");
    let mut daemon = start_daemon(&dir, "[[gpu]]\nindex = 0\nhbm = \"64MiB\"\n");
    let args = ["--working-set", "48MiB", "--seconds", "600"];
    let tenants = vec![start_tenant(&dir, None, &args), start_tenant(&dir, None, &args)];
    wait_for_shares(&dir.socket(), "two halves of 64 MiB", |shares| {
        shares.len() == 2 && shares.iter().all(|(_, s)| s.budget == 32 * MIB)
    });
    daemon.kill();
    // The new daemon has less to share: the tenants come back to it and shrink to its halves.
    let _daemon = start_daemon(&dir, "[[gpu]]\nindex = 0\nhbm = \"40MiB\"\n");
    wait_for_shares(&dir.socket(), "two halves of 40 MiB", |shares| {
        shares.len() == 2 && shares.iter().all(|(_, s)| s.budget == 20 * MIB && s.target == 20 * MIB)
    });
    let reports = stop_and_verify(&dir, tenants);
    for report in reports {
        assert!(report["sessions"].as_u64().unwrap() >= 2, "reconnected: {report}");
        // 20 MiB, or all 40 once the other tenant has left first.
        assert!(report["hbm_cap"].as_u64().unwrap() <= 40 * MIB, "the new daemon's budget: {report}");
    }
}
