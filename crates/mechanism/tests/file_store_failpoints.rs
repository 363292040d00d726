//! Injected I/O errors through the `file_store::write` / `file_store::read` failpoints.
#![cfg(feature = "failpoints")]

mod file_store_common;

use file_store_common::{config, open, read_one, AlignedBuf, PATHS};
use tiermem_mechanism::file_store::{FileStore, FileStoreError};

const SLOT: usize = 64 << 10;

fn write_all(
    store: &FileStore,
    slots: &[tiermem_mechanism::file_store::FileSlot],
    src: &AlignedBuf,
) -> Result<(), FileStoreError> {
    let items: Vec<_> = slots.iter().enumerate().map(|(i, &s)| (s, src.ptr().wrapping_add(i * SLOT))).collect();
    // SAFETY: aligned SLOT-sized pieces of `src`, alive through the call.
    unsafe { store.write(&items) }
}

fn check(store: &FileStore, slot: tiermem_mechanism::file_store::FileSlot, want: &[u8]) {
    let mut dst = AlignedBuf::new(SLOT);
    read_one(store, slot, &mut dst).unwrap();
    assert!(dst.as_slice() == want, "slot {} holds the wrong bytes", slot.0);
}

#[test]
fn injected_eio_on_write() {
    let scenario = fail::FailScenario::setup();
    for io in PATHS {
        let Some(store) = open(config("fp-write", 5, SLOT, io)) else {
            continue;
        };
        let slots = store.alloc(5).unwrap();
        let old = AlignedBuf::random(5 * SLOT, 1);
        let new = AlignedBuf::random(5 * SLOT, 2);
        write_all(&store, &slots, &old).unwrap();

        // The third slot's write fails; the two before it are written, the two after not started.
        fail::cfg("file_store::write", "2*off->1*return->off").unwrap();
        let err = write_all(&store, &slots, &new).unwrap_err();
        fail::remove("file_store::write");
        eprintln!("{io:?}: {err}");
        assert!(
            matches!(err, FileStoreError::Io { slot: 2, offset, errno: libc::EIO, .. } if offset == 2 * SLOT as u64),
            "{err}"
        );
        assert_eq!(err.errno(), Some(libc::EIO));
        let msg = err.to_string();
        assert!(msg.contains("failed on slot 2 (offset 131072): Input/output error"), "{msg}");
        assert!(msg.contains("[injected: failpoint"), "{msg}");
        check(&store, slots[0], &new.as_slice()[..SLOT]);
        check(&store, slots[1], &new.as_slice()[SLOT..2 * SLOT]);
        let mut dst = AlignedBuf::new(SLOT);
        let e = read_one(&store, slots[2], &mut dst).unwrap_err();
        assert!(matches!(e, FileStoreError::NoData { slot: 2, .. }), "{e}");
        check(&store, slots[3], &old.as_slice()[3 * SLOT..4 * SLOT]);
        check(&store, slots[4], &old.as_slice()[4 * SLOT..]);
        // Retrying the write after the fault passes.
        write_all(&store, &slots, &new).unwrap();
        check(&store, slots[2], &new.as_slice()[2 * SLOT..3 * SLOT]);
    }
    scenario.teardown();
}

#[test]
fn injected_enospc_on_write() {
    let scenario = fail::FailScenario::setup();
    for io in PATHS {
        let Some(store) = open(config("fp-nospace", 3, SLOT, io)) else {
            continue;
        };
        let slots = store.alloc(3).unwrap();
        let src = AlignedBuf::random(3 * SLOT, 3);
        let before = src.as_slice().to_vec();
        fail::cfg("file_store::write", "return(28)").unwrap();
        let err = write_all(&store, &slots, &src).unwrap_err();
        fail::remove("file_store::write");
        assert!(matches!(err, FileStoreError::NoSpace { slot: 0, errno: libc::ENOSPC, .. }), "{err}");
        let msg = err.to_string();
        assert!(msg.contains("No space left on device (os error 28)"), "{msg}");
        assert!(msg.contains("the caller's bytes are untouched"), "{msg}");
        assert!(src.as_slice() == &before[..]);
        write_all(&store, &slots, &src).unwrap();
    }
    scenario.teardown();
}

#[test]
fn injected_eio_on_read() {
    let scenario = fail::FailScenario::setup();
    for io in PATHS {
        let Some(store) = open(config("fp-read", 3, SLOT, io)) else {
            continue;
        };
        let slots = store.alloc(3).unwrap();
        let src = AlignedBuf::random(3 * SLOT, 4);
        write_all(&store, &slots, &src).unwrap();
        let mut dst = AlignedBuf::new(3 * SLOT);
        let base = dst.mut_ptr();
        let items: Vec<_> = slots.iter().enumerate().map(|(i, &s)| (s, base.wrapping_add(i * SLOT))).collect();
        fail::cfg("file_store::read", "1*off->return").unwrap();
        // SAFETY: aligned, distinct SLOT-sized pieces of `dst`, alive through the call.
        let err = unsafe { store.read(&items) }.unwrap_err();
        assert!(matches!(err, FileStoreError::Io { slot: 1, errno: libc::EIO, .. }), "{err}");
        assert!(err.to_string().contains("failed on slot 1 (offset 65536): Input/output error"), "{err}");
        fail::remove("file_store::read");
        // SAFETY: as above.
        unsafe { store.read(&items) }.unwrap();
        assert!(dst.as_slice() == src.as_slice());
    }
    scenario.teardown();
}
