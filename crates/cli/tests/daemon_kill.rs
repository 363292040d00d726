//! A tenant killed with SIGKILL frees its budget at once: the other grows to the whole GPU,
//! and finishes with every byte verified.

mod support;
use support::*;

#[test]
fn a_tenant_killed_with_sigkill_frees_its_budget() {
    let dir = TempDir::new("kill");
    let _daemon = start_daemon(&dir, "[[gpu]]\nindex = 0\nhbm = \"64MiB\"\n");
    let args = ["--working-set", "48MiB", "--seconds", "600"];
    let survivor = start_tenant(&dir, None, &args);
    let mut victim = start_tenant(&dir, None, &args);
    wait_for_shares(&dir.socket(), "two halves", |shares| {
        shares.len() == 2 && shares.iter().all(|(_, s)| s.budget == 32 * MIB && s.target == 32 * MIB)
    });
    let victim_pid = victim.pid();
    victim.kill();
    let shares = wait_for_shares(&dir.socket(), "the survivor to get everything", |shares| {
        shares.len() == 1 && shares[0].1.budget == 64 * MIB
    });
    let report = status(&dir.socket()).unwrap();
    assert!(report.tenants.iter().all(|t| t.pid != victim_pid), "the victim is gone: {report:?}");
    assert_eq!(shares[0].1.target, 64 * MIB);
    stop_and_verify(&dir, vec![survivor]);
}
