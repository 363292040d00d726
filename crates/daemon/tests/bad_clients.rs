//! The daemon over its socket, in-process: clients that send garbage, oversized frames,
//! another version or messages out of order get an error and are closed; the daemon goes on
//! serving well-behaved clients, and a tenant that disconnects gives its budget back.

mod support;
use std::io::Write;
use std::time::Duration;
use support::*;
use tiermem_protocol::*;

#[test]
fn bad_clients_are_refused_and_the_daemon_survives() {
    let (path, _) = start_daemon("bad", false);
    let (mut s, mut r) = connect(&path);
    s.write_all(&[0, 0, 0, 8, b'g', b'a', b'r', b'b', b'a', b'g', b'e', b'!']).unwrap();
    assert_eq!(expect_error_and_close(&mut r), ErrorKind::Malformed);

    let (mut s, mut r) = connect(&path);
    s.write_all(&u32::MAX.to_be_bytes()).unwrap();
    assert_eq!(expect_error_and_close(&mut r), ErrorKind::TooLarge);

    let (mut s, mut r) = connect(&path);
    write_message(&mut s, &ClientMessage::Hello { version: PROTOCOL_VERSION + 7, client: "future".into() }).unwrap();
    assert_eq!(expect_error_and_close(&mut r), ErrorKind::VersionMismatch);

    let (mut s, mut r) = connect(&path);
    write_message(&mut s, &ClientMessage::BudgetMet { seq: 1 }).unwrap();
    assert_eq!(expect_error_and_close(&mut r), ErrorKind::OutOfOrder);

    let (mut s, mut r) = connect(&path);
    hello(&mut s, &mut r);
    write_message(
        &mut s,
        &ClientMessage::Usage {
            hbm: TierUsage::default(),
            host: TierUsage::default(),
            file: TierUsage::default(),
            peer: TierUsage::default(),
            transfers: TransferCounters::default(),
        },
    )
    .unwrap();
    assert_eq!(expect_error_and_close(&mut r), ErrorKind::OutOfOrder);

    let (mut s, mut r) = connect(&path);
    hello(&mut s, &mut r);
    let gpu = GpuId { index: 0, uuid: None, total_bytes: 1 << 30, simulated: true };
    let odd = ClientMessage::Register {
        pid: 1,
        label: None,
        gpu,
        chunk_bytes: u64::MAX,
        wants: vec![],
        held: vec![],
        lent_slab_bytes: None,
        waits: false,
        job: None,
    };
    write_message(&mut s, &odd).unwrap();
    assert_eq!(expect_error_and_close(&mut r), ErrorKind::Refused);

    // A client that vanishes mid-frame.
    let (mut s, _) = connect(&path);
    s.write_all(&[0, 0, 1]).unwrap();
    drop(s);

    // A client that asks and asks but never reads its replies is cut off.
    let (mut s, mut r) = connect(&path);
    hello(&mut s, &mut r);
    let request = encode(&ClientMessage::StatusRequest).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    for _ in 0..20_000 {
        if s.write_all(&request).is_err() {
            break; // closed by the daemon
        }
    }
    let closed = loop {
        match r.wait::<DaemonMessage>(deadline()) {
            Err(ProtocolError::Closed | ProtocolError::Io(_)) => break true,
            Err(ProtocolError::Timeout) => break false,
            _ => continue,
        }
    };
    assert!(closed, "a client that does not read is closed");

    // Still serving.
    let (mut s, mut r) = connect(&path);
    let (_, budget) = register(&mut s, &mut r);
    assert_eq!(budget, 64 << 20);
}

#[test]
fn a_tenant_that_disconnects_gives_its_budget_back_at_once() {
    let (path, _) = start_daemon("leave", false);
    let (mut a, mut ra) = connect(&path);
    let (_, alone) = register(&mut a, &mut ra);
    assert_eq!(alone, 64 << 20);
    let (mut b, mut rb) = connect(&path);
    register(&mut b, &mut rb);
    // A is cut to half; meeting it lets B grow to its half.
    let DaemonMessage::Budget { seq, tiers, .. } = ra.wait(deadline()).unwrap() else { panic!("a cut") };
    assert_eq!(tiers[0].bytes, 32 << 20);
    write_message(&mut a, &ClientMessage::BudgetMet { seq }).unwrap();
    let DaemonMessage::Budget { tiers, .. } = rb.wait(deadline()).unwrap() else { panic!("a grant") };
    assert_eq!(tiers[0].bytes, 32 << 20);
    drop((a, ra));
    let DaemonMessage::Budget { tiers, .. } = rb.wait(deadline()).unwrap() else { panic!("everything") };
    assert_eq!(tiers[0].bytes, 64 << 20);

    // Status from another connection sees B alone (the test runs as the daemon's user).
    let (mut c, mut rc) = connect(&path);
    hello(&mut c, &mut rc);
    write_message(&mut c, &ClientMessage::StatusRequest).unwrap();
    let DaemonMessage::Status(report) = rc.wait(deadline()).unwrap() else { panic!("status") };
    assert_eq!(report.tenants.len(), 1);
    assert_eq!(report.pools[0].budgeted, 64 << 20);
}
