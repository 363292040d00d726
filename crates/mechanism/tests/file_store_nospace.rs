//! A write the file cannot take (here: beyond `RLIMIT_FSIZE`, which the kernel answers with a
//! short write and then `EFBIG`, as a full disk answers with `ENOSPC`) is a clear error, the
//! caller's bytes are untouched, and the slots written before it are intact.
//!
//! The limit is process-wide, so the test re-runs itself in a child process that does nothing
//! else.

mod file_store_common;

use file_store_common::{config, open, read_one, AlignedBuf};
use tiermem_mechanism::file_store::{FileStoreError, IoChoice};

const SLOT: usize = 64 << 10;
const CHILD_ENV: &str = "TIERMEM_FILE_STORE_NOSPACE_CHILD";

#[test]
fn file_size_limit_is_a_clear_error() {
    if let Ok(which) = std::env::var(CHILD_ENV) {
        let io = which.parse::<IoChoice>().unwrap();
        child(io);
        return;
    }
    for io in ["uring", "threads"] {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["file_size_limit_is_a_clear_error", "--exact", "--nocapture"])
            .args(["--test-threads", "1"])
            .env(CHILD_ENV, io)
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        eprintln!("--- child ({io}) ---\n{text}");
        assert!(out.status.success(), "child for {io} failed: {:?}", out.status);
        assert!(text.contains("1 passed"), "child for {io} ran no test");
    }
}

fn child(io: IoChoice) {
    // One slot in flight at a time, so which slots were started is deterministic.
    let mut cfg = config("nospace", 8, SLOT, io);
    cfg.queue_depth = 1;
    let Some(store) = open(cfg) else {
        return;
    };
    let slots = store.alloc(8).unwrap();
    let src = AlignedBuf::random(8 * SLOT, 11);
    let before = src.as_slice().to_vec();
    // SAFETY: ignoring SIGXFSZ (sent with EFBIG) in this single-purpose child process.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let limit = 4 * SLOT as u64 + 4096;
    let rl = libc::rlimit { rlim_cur: limit, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: plain syscall with a valid rlimit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &rl) }, 0);

    let items: Vec<_> = slots.iter().enumerate().map(|(i, &s)| (s, src.ptr().wrapping_add(i * SLOT))).collect();
    // SAFETY: aligned SLOT-sized pieces of `src`, alive through the call.
    let err = unsafe { store.write(&items) }.unwrap_err();
    eprintln!("write error: {err}");
    match &err {
        FileStoreError::NoSpace { slot: 4, offset, errno, detail, .. } => {
            assert_eq!(*offset, 4 * SLOT as u64);
            assert_eq!(*errno, libc::EFBIG);
            assert!(detail.contains("after 4096 of 65536 bytes"), "{detail}");
        }
        other => panic!("expected NoSpace on slot 4, got: {other}"),
    }
    assert!(err.to_string().contains("(the caller's bytes are untouched)"));
    assert!(src.as_slice() == &before[..], "the source was modified");

    // Raise the limit again: slots 0..4 hold their data; slot 4 holds none.
    let rl = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &rl) }, 0);
    let mut dst = AlignedBuf::new(SLOT);
    for i in 0..4 {
        read_one(&store, slots[i], &mut dst).unwrap();
        assert!(dst.as_slice() == &before[i * SLOT..(i + 1) * SLOT]);
    }
    let err = read_one(&store, slots[4], &mut dst).unwrap_err();
    assert!(matches!(err, FileStoreError::NoData { slot: 4, .. }), "{err}");
    // And the same write succeeds now.
    // SAFETY: as above.
    unsafe { store.write(&items) }.unwrap();
    read_one(&store, slots[7], &mut dst).unwrap();
    assert!(dst.as_slice() == &before[7 * SLOT..]);
    drop(store);
    many_in_flight(io, limit);
}

/// With all slots in flight at once, which slots were started before the first failure
/// depends on timing; what holds regardless: the error is `NoSpace` on a slot past the limit,
/// and every slot reads back either the new bytes or "holds no data", never wrong bytes.
fn many_in_flight(io: IoChoice, limit: u64) {
    let Some(store) = open(config("nospace-qd8", 8, SLOT, io)) else {
        return;
    };
    let slots = store.alloc(8).unwrap();
    let src = AlignedBuf::random(8 * SLOT, 12);
    let items: Vec<_> = slots.iter().enumerate().map(|(i, &s)| (s, src.ptr().wrapping_add(i * SLOT))).collect();
    let rl = libc::rlimit { rlim_cur: limit, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: plain syscall with a valid rlimit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &rl) }, 0);
    // SAFETY: aligned SLOT-sized pieces of `src`, alive through the call.
    let err = unsafe { store.write(&items) }.unwrap_err();
    let rl = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &rl) }, 0);
    eprintln!("write error with 8 in flight: {err}");
    assert!(matches!(err, FileStoreError::NoSpace { slot, errno: libc::EFBIG, .. } if slot >= 4), "{err}");
    let mut dst = AlignedBuf::new(SLOT);
    for (i, &s) in slots.iter().enumerate() {
        match read_one(&store, s, &mut dst) {
            Ok(()) => {
                assert!(i < 4, "slot {i} is past the limit yet claims data");
                assert!(dst.as_slice() == &src.as_slice()[i * SLOT..(i + 1) * SLOT]);
            }
            Err(FileStoreError::NoData { .. }) => {}
            Err(e) => panic!("slot {i}: {e}"),
        }
    }
}
