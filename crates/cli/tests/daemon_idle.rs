//! Two tenant processes under one daemon; one stops acquiring (paused between rounds): once
//! idle, it keeps only its largest acquire and the other gets the memory; when it works
//! again, the halves come back. Every byte of both is verified at the end.

mod support;
use support::*;

#[test]
fn an_idle_tenant_lends_its_share_and_gets_it_back_when_it_works_again() {
    let dir = TempDir::new("idle");
    let _daemon = start_daemon(&dir, "idle_after_ms = 300\n[[gpu]]\nindex = 0\nhbm = \"64MiB\"\n");
    let pause = dir.0.join("pause-a");
    let pause_arg = pause.to_str().unwrap();
    let a = start_tenant(&dir, Some("a"), &["--working-set", "48MiB", "--seconds", "600", "--pause-file", pause_arg]);
    let b = start_tenant(&dir, Some("b"), &["--working-set", "48MiB", "--seconds", "600"]);
    let halves = |shares: &[(String, tiermem_protocol::ShareStatus)]| {
        shares.len() == 2 && shares.iter().all(|(_, s)| s.budget == 32 * MIB && s.target == 32 * MIB)
    };
    wait_for_shares(&dir.socket(), "halves of 32 MiB", halves);

    // Which share is whose: the tenants are told apart by their labels.
    let report = status(&dir.socket()).unwrap();
    let id_of = |label: &str| report.tenants.iter().find(|t| t.label.as_deref() == Some(label)).unwrap().tenant;
    let (id_a, id_b) = (id_of("a"), id_of("b"));
    let of =
        |shares: &[(String, tiermem_protocol::ShareStatus)], id| shares.iter().find(|(_, s)| s.tenant == id).cloned();

    std::fs::write(&pause, b"").unwrap();
    // A idle: its demand is its largest acquire (one 2 MiB chunk: tenant-demo reads and writes
    // a chunk at a time); B gets its whole working set.
    wait_for_shares(&dir.socket(), "A lending, B with its whole working set", |shares| {
        let (a, b) = (of(shares, id_a), of(shares, id_b));
        a.is_some_and(|(_, a)| a.budget <= 16 * MIB) && b.is_some_and(|(_, b)| b.budget >= 48 * MIB)
    });
    let report = status(&dir.socket()).unwrap();
    assert!(report.tenants.iter().find(|t| t.tenant == id_a).unwrap().idle);
    assert!(!report.tenants.iter().find(|t| t.tenant == id_b).unwrap().idle);
    // B then holds more than half the GPU.
    wait_for_shares(&dir.socket(), "B using what A lent", |shares| {
        of(shares, id_b).is_some_and(|(_, b)| b.used > 32 * MIB)
    });

    std::fs::remove_file(&pause).unwrap();
    wait_for_shares(&dir.socket(), "halves again once A works", halves);
    let reports = stop_and_verify(&dir, vec![a, b]);
    assert!(reports.iter().all(|r| r["rounds"].as_u64().unwrap() >= 1));
}
