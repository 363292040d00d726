//! HBM lent between processes: `tiermem lend` on GPU 1 of a simulated node, a tenant on GPU 0
//! of another (each process has its own simulated node; the slabs are memfds passed through
//! the daemon with SCM_RIGHTS). The tenant's chunks beyond its HBM go to the lent slab; when
//! the lender goes, the slab is returned; when the tenant goes, the lender is told to release;
//! a tenant that does not return a slab in time is killed. Every byte verified.

mod support;
use support::*;
use tiermem_protocol::StatusReport;

const CONFIG: &str = "[[gpu]]\nindex = 0\nhbm = \"32MiB\"\n[lending]\nreturn_deadline_ms = 2000\n";
/// A tenant on GPU 0 of a node of two that borrows only what lenders of other processes lend.
const BORROWER: &[(&str, &str)] = &[("TIERMEM_SIM_GPUS", "2"), ("TIERMEM_PEERS", "off")];

fn lent(report: &StatusReport) -> u64 {
    report.lenders.iter().flat_map(|l| l.lent.iter()).map(|(_, bytes)| bytes).sum()
}

fn borrower(dir: &TempDir) -> Process {
    start_tenant_with(dir, Some("b"), &["--working-set", "96MiB", "--seconds", "600"], BORROWER)
}

fn wait_for_status(dir: &TempDir, what: &str, condition: impl Fn(&StatusReport) -> bool) {
    wait_for(what, || status(&dir.socket()).is_some_and(|r| condition(&r)));
}

#[test]
fn a_tenant_borrows_a_lent_slab_returns_it_when_the_lender_goes_and_its_bytes_survive() {
    let dir = TempDir::new("lend");
    let _daemon = start_daemon(&dir, CONFIG);
    let mut lender = start_lender(&dir, "128MiB");
    let tenant = borrower(&dir);
    // 96 MiB against a 32 MiB budget: it wants 64 MiB more, one slab.
    wait_for_status(&dir, "a slab lent to the tenant", |r| lent(r) == 64 * MIB);
    lender.kill();
    wait_for_status(&dir, "the lender forgotten once its slab is back", |r| r.lenders.is_empty());
    // A new lender: the tenant borrows again; when it ends, the lender is told to release.
    let _lender = start_lender(&dir, "128MiB");
    wait_for_status(&dir, "a slab lent again", |r| lent(r) == 64 * MIB);
    let reports = stop_and_verify(&dir, vec![tenant]);
    assert!(reports[0]["rounds"].as_u64().unwrap() >= 1);
    assert!(reports[0]["peer_chunks_most"].as_u64().unwrap() > 0, "chunks went to lent slabs: {}", reports[0]);
    wait_for_status(&dir, "nothing lent once the tenant is gone", |r| r.lenders.len() == 1 && lent(r) == 0);
}

#[test]
fn a_tenant_that_does_not_return_a_slab_in_time_is_killed() {
    let dir = TempDir::new("lend-late");
    let _daemon = start_daemon(&dir, CONFIG);
    let mut lender = start_lender(&dir, "128MiB");
    let mut tenant = borrower(&dir);
    // Stopped while it holds the slab: a tenant may give a slab back on its own (its want
    // changed, or mapping failed), and a stop just after that would leave nothing to return.
    let signal = |sig: i32| {
        // SAFETY: signals our own child; it is killed (and reaped) below or by the daemon.
        assert_eq!(unsafe { libc::kill(tenant.pid() as i32, sig) }, 0);
    };
    wait_for("the tenant stopped while a slab is lent to it", || {
        wait_for_status(&dir, "a slab lent to the tenant", |r| lent(r) == 64 * MIB);
        signal(libc::SIGSTOP);
        // What it sent before it stopped reaches the daemon meanwhile.
        std::thread::sleep(std::time::Duration::from_millis(300));
        let holds = status(&dir.socket()).is_some_and(|r| lent(&r) == 64 * MIB);
        if !holds {
            signal(libc::SIGCONT);
        }
        holds
    });
    lender.kill();
    wait_for_status(&dir, "the stopped tenant killed past the deadline", |r| r.tenants.is_empty());
    let out = tenant.wait();
    assert!(!out.success(), "killed: {out:?}");
    wait_for_status(&dir, "the lender forgotten", |r| r.lenders.is_empty());
}
