//! The decoder against garbage (a fuzz: random bytes never panic), round trips of every
//! message, the frame limit, and the order of messages.

use proptest::prelude::*;
use tiermem_protocol::*;

fn tier() -> impl Strategy<Value = Tier> {
    prop::sample::select(Tier::ALL.to_vec())
}

fn usage() -> impl Strategy<Value = TierUsage> {
    (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(used, acquired, demand, reserved)| TierUsage {
        used,
        acquired,
        demand,
        reserved,
    })
}

fn ids() -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec(any::<u64>(), 0..8)
}

fn client_message() -> impl Strategy<Value = ClientMessage> {
    let gpu = (any::<u32>(), prop::option::of("[a-zA-Z0-9-]{0,40}"), any::<u64>(), any::<bool>())
        .prop_map(|(index, uuid, total_bytes, simulated)| GpuId { index, uuid, total_bytes, simulated });
    let amounts =
        || prop::collection::vec((tier(), any::<u64>()).prop_map(|(tier, bytes)| TierBytes { tier, bytes }), 0..4);
    prop_oneof![
        (any::<u32>(), ".{0,30}").prop_map(|(version, client)| ClientMessage::Hello { version, client }),
        (
            any::<u32>(),
            prop::option::of(".{0,30}"),
            gpu.clone(),
            any::<u64>(),
            amounts(),
            amounts(),
            prop::option::of(any::<u64>()),
            any::<bool>(),
            prop::option::of(any::<u32>())
        )
            .prop_map(|(pid, label, gpu, chunk_bytes, wants, held, lent_slab_bytes, waits, job)| {
                ClientMessage::Register { pid, label, gpu, chunk_bytes, wants, held, lent_slab_bytes, waits, job }
            }),
        (any::<u32>(), gpu, any::<u64>()).prop_map(|(pid, gpu, offer_bytes)| ClientMessage::Lend {
            pid,
            gpu,
            offer_bytes
        }),
        any::<u64>().prop_map(|bytes| ClientMessage::Offer { bytes }),
        (ids(), ids(), prop::option::of(".{0,30}")).prop_map(|(ids, failed, error)| ClientMessage::Slabs {
            ids,
            failed,
            error
        }),
        ids().prop_map(|ids| ClientMessage::Returned { ids }),
        (usage(), usage(), usage(), usage(), any::<[u64; 6]>(), any::<[u64; 2]>()).prop_map(
            |(
                hbm,
                host,
                file,
                peer,
                [bytes_in, bytes_out, evictions, stall_us, acquires, largest_acquire_bytes],
                [launches, launches_all_in_hbm],
            )| {
                let transfers = TransferCounters {
                    bytes_in,
                    bytes_out,
                    evictions,
                    stall_us,
                    acquires,
                    largest_acquire_bytes,
                    launches,
                    launches_all_in_hbm,
                };
                ClientMessage::Usage { hbm, host, file, peer, transfers }
            }
        ),
        any::<u64>().prop_map(|seq| ClientMessage::BudgetMet { seq }),
        Just(ClientMessage::StatusRequest),
    ]
}

fn daemon_message() -> impl Strategy<Value = DaemonMessage> {
    let budget =
        (tier(), any::<u64>(), any::<u64>()).prop_map(|(tier, bytes, target)| TierBudget { tier, bytes, target });
    prop_oneof![
        (any::<u32>(), ".{0,30}").prop_map(|(version, daemon)| DaemonMessage::Welcome { version, daemon }),
        (any::<u64>(), ".{0,30}").prop_map(|(tenant, name)| DaemonMessage::Registered { tenant, name }),
        (any::<u64>(), prop::collection::vec(budget, 0..4), any::<u64>(), any::<bool>(), any::<bool>()).prop_map(
            |(seq, tiers, deadline_ms, wait, others_wait)| DaemonMessage::Budget {
                seq,
                tiers,
                deadline_ms,
                wait,
                others_wait
            }
        ),
        ".{0,60}".prop_map(|message| DaemonMessage::Error { kind: ErrorKind::Malformed, message }),
        (ids(), any::<u64>()).prop_map(|(ids, slab_bytes)| DaemonMessage::MakeSlabs { ids, slab_bytes }),
        (any::<u32>(), any::<u64>(), ids()).prop_map(|(gpu, slab_bytes, ids)| DaemonMessage::Lent {
            gpu,
            slab_bytes,
            ids
        }),
        (ids(), any::<u64>()).prop_map(|(ids, deadline_ms)| DaemonMessage::Return { ids, deadline_ms }),
        ids().prop_map(|ids| DaemonMessage::Release { ids }),
    ]
}

/// Feeds `bytes` in pieces of `step` and decodes all it can, until an error.
fn decode_all(bytes: &[u8], step: usize) -> Vec<Result<ClientMessage, String>> {
    let mut decoder = FrameDecoder::new();
    let mut out = Vec::new();
    for piece in bytes.chunks(step.max(1)) {
        decoder.extend(piece);
        loop {
            match decoder.next_message::<ClientMessage>() {
                Ok(Some(m)) => out.push(Ok(m)),
                Ok(None) => break,
                Err(e) => {
                    out.push(Err(e.to_string()));
                    return out;
                }
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048), step in 1usize..64) {
        let _ = decode_all(&bytes, step);
    }

    #[test]
    fn a_valid_header_over_random_json_never_panics(body in prop::collection::vec(any::<u8>(), 0..512), step in 1usize..64) {
        let mut bytes = (body.len() as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(&body);
        let decoded = decode_all(&bytes, step);
        prop_assert!(decoded.len() <= 1);
    }

    #[test]
    fn client_messages_round_trip_in_any_pieces(messages in prop::collection::vec(client_message(), 1..6), step in 1usize..200) {
        let mut bytes = Vec::new();
        for m in &messages {
            bytes.extend(encode(m).unwrap());
        }
        let decoded: Vec<ClientMessage> = decode_all(&bytes, step).into_iter().map(|r| r.unwrap()).collect();
        prop_assert_eq!(decoded, messages);
    }

    #[test]
    fn daemon_messages_round_trip(message in daemon_message()) {
        let mut decoder = FrameDecoder::new();
        decoder.extend(&encode(&message).unwrap());
        prop_assert_eq!(decoder.next_message::<DaemonMessage>().unwrap(), Some(message));
        prop_assert_eq!(decoder.pending(), 0);
    }

    #[test]
    fn sessions_never_panic_on_any_order(messages in prop::collection::vec(client_message(), 0..12)) {
        let mut session = ServerSession::new();
        for m in &messages {
            if session.accept(m).is_err() {
                break;
            }
        }
    }
}

#[test]
fn an_oversized_frame_is_refused_before_it_is_buffered() {
    let mut decoder = FrameDecoder::new();
    decoder.extend(&((MAX_FRAME_BYTES as u32) + 1).to_be_bytes());
    let error = decoder.next_message::<ClientMessage>().unwrap_err();
    assert!(matches!(error, ProtocolError::FrameTooLarge { .. }), "{error}");
    assert_eq!(error.kind(), ErrorKind::TooLarge);
    let huge = ClientMessage::Hello { version: 1, client: "x".repeat(MAX_FRAME_BYTES) };
    assert!(matches!(encode(&huge), Err(ProtocolError::FrameTooLarge { .. })));
}

#[test]
fn garbage_is_malformed() {
    let mut decoder = FrameDecoder::new();
    decoder.extend(&[0, 0, 0, 5, b'h', b'e', b'l', b'l', b'o']);
    assert!(matches!(decoder.next_message::<ClientMessage>(), Err(ProtocolError::Malformed(_))));
    let mut decoder = FrameDecoder::new();
    decoder.extend(&encode(&serde_json::json!({"type": "register", "pid": "not a number"})).unwrap());
    assert!(matches!(decoder.next_message::<ClientMessage>(), Err(ProtocolError::Malformed(_))));
}

#[test]
fn the_session_enforces_hello_then_register_then_usage() {
    let hello = ClientMessage::Hello { version: PROTOCOL_VERSION, client: "test".into() };
    let usage = ClientMessage::Usage {
        hbm: TierUsage::default(),
        host: TierUsage::default(),
        file: TierUsage::default(),
        peer: TierUsage::default(),
        transfers: TransferCounters::default(),
    };
    let register = ClientMessage::Register {
        pid: 1,
        label: None,
        gpu: GpuId { index: 0, uuid: None, total_bytes: 1 << 30, simulated: true },
        chunk_bytes: 2 << 20,
        wants: vec![],
        held: vec![],
        lent_slab_bytes: None,
        waits: false,
        job: None,
    };
    let mut s = ServerSession::new();
    assert!(matches!(s.accept(&usage), Err(ProtocolError::OutOfOrder { expected: "hello", got: "usage" })));
    let mut s = ServerSession::new();
    let old = ClientMessage::Hello { version: PROTOCOL_VERSION + 1, client: "future".into() };
    let mismatch = s.accept(&old).unwrap_err();
    assert!(mismatch.to_string().contains("same release"), "{mismatch}");
    let mut s = ServerSession::new();
    s.accept(&hello).unwrap();
    assert!(matches!(s.accept(&usage), Err(ProtocolError::OutOfOrder { .. })));
    let mut s = ServerSession::new();
    s.accept(&hello).unwrap();
    s.accept(&ClientMessage::StatusRequest).unwrap();
    s.accept(&register).unwrap();
    assert_eq!(s.state(), SessionState::Tenant);
    s.accept(&usage).unwrap();
    s.accept(&ClientMessage::BudgetMet { seq: 3 }).unwrap();
    assert!(matches!(s.accept(&register), Err(ProtocolError::OutOfOrder { got: "register", .. })));
    assert!(matches!(s.accept(&hello), Err(ProtocolError::OutOfOrder { got: "hello", .. })));
}

#[test]
fn the_client_checks_the_welcome() {
    let ok = DaemonMessage::Welcome { version: PROTOCOL_VERSION, daemon: "tiermemd".into() };
    assert_eq!(check_welcome(ok).unwrap(), "tiermemd");
    let newer = DaemonMessage::Welcome { version: PROTOCOL_VERSION + 1, daemon: "x".into() };
    assert!(matches!(check_welcome(newer), Err(ProtocolError::VersionMismatch { .. })));
    let refused = DaemonMessage::Error { kind: ErrorKind::VersionMismatch, message: "old".into() };
    assert!(matches!(check_welcome(refused), Err(ProtocolError::Refused { kind: ErrorKind::VersionMismatch, .. })));
}

#[test]
fn a_reader_keeps_a_partial_frame_across_timeouts() {
    /// Gives one byte per read, with a "timeout" between.
    struct Trickle(Vec<u8>, bool);
    impl std::io::Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.1 = !self.1;
            if self.1 {
                return Err(std::io::ErrorKind::WouldBlock.into());
            }
            if self.0.is_empty() {
                return Ok(0);
            }
            buf[0] = self.0.remove(0);
            Ok(1)
        }
    }
    let message = ClientMessage::BudgetMet { seq: 42 };
    let mut reader = FrameReader::new(Trickle(encode(&message).unwrap(), false));
    let mut timeouts = 0;
    let got = loop {
        match reader.poll::<ClientMessage>().unwrap() {
            Some(m) => break m,
            None => timeouts += 1,
        }
    };
    assert_eq!(got, message);
    assert!(timeouts > 10);
    assert!(matches!(reader.poll::<ClientMessage>(), Ok(None)), "a timeout");
    assert!(matches!(reader.poll::<ClientMessage>(), Err(ProtocolError::Closed)));
}
