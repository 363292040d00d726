//! Three tenant processes under one daemon: budgets converge to weighted fair shares (2:1:1),
//! each engine then holds no more than its budget, and every byte is verified.

mod support;
use support::*;

#[test]
fn budgets_converge_to_weighted_fair_shares() {
    let dir = TempDir::new("fair-share");
    let _daemon = start_daemon(
        &dir,
        "[[gpu]]\nindex = 0\nhbm = \"96MiB\"\n[[tenant]]\nname = \"heavy\"\nlabel = \"heavy\"\nweight = 2\n",
    );
    let args = ["--working-set", "64MiB", "--seconds", "600"];
    let tenants = vec![
        start_tenant(&dir, Some("heavy"), &args),
        start_tenant(&dir, None, &args),
        start_tenant(&dir, None, &args),
    ];
    let shares = wait_for_shares(&dir.socket(), "shares of 48, 24 and 24 MiB", |shares| {
        let budgets: Vec<u64> = shares.iter().map(|(_, s)| s.budget).collect();
        shares.len() == 3
            && shares.iter().all(|(_, s)| s.budget == s.target)
            && budgets == [24 * MIB, 24 * MIB, 48 * MIB] // default, default, heavy
    });
    assert_eq!(shares[2].0, "heavy");
    // Each engine meets its budget: what it reports holding comes within it.
    wait_for_shares(&dir.socket(), "every tenant within its budget", |shares| {
        shares.len() == 3 && shares.iter().all(|(_, s)| s.used <= s.budget && s.used > 0)
    });
    let reports = stop_and_verify(&dir, tenants);
    assert!(reports.iter().all(|r| r["rounds"].as_u64().unwrap() >= 1));
}
