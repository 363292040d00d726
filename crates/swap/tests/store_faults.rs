//! Driver calls failing under the store (failpoints of the simulated device, named after the
//! CUDA calls): the request fails with EIO, nothing else is touched — every byte written
//! before reads back unchanged once the fault is gone, an area whose first write failed is
//! not left half-made, and the same request succeeds when retried.
//!
//! Failpoints are process-global: the tests here take one lock. Run with
//! `cargo test -p tiermem-swap --features failpoints`.
#![cfg(feature = "failpoints")]

mod support;

use std::sync::Mutex;
use support::{config, open, pattern, CHUNK, MIB};
use tiermem_swap::{Blocks, VramStore};

static LOCK: Mutex<()> = Mutex::new(());

/// Runs `request` with the driver call `cuda` failing every time; asserts it fails with EIO.
fn fails_with_eio<T>(cuda: &str, request: impl FnOnce() -> Result<T, tiermem_swap::SwapError>) {
    let scenario = fail::FailScenario::setup();
    fail::cfg(cuda, "return").unwrap();
    let outcome = request();
    scenario.teardown();
    match outcome {
        Ok(_) => panic!("the request succeeded with {cuda} failing"),
        Err(e) => assert_eq!(e.errno(), libc::EIO, "{cuda}: {e}"),
    }
}

fn check(store: &VramStore, offset: u64, want: &[u8]) {
    let mut back = vec![0u8; want.len()];
    store.read(offset, &mut back).expect("a read once the fault is gone");
    assert!(back == want, "bytes at {offset} changed");
}

#[test]
fn failed_copies_fail_their_request_alone() {
    let _serial = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    // Four chunks of HBM for eight areas: the data also lives in the host tier and the file.
    let store = open(config("faults", 16 * MIB, 4, 2, 16));
    let first = pattern(1, (6 * CHUNK) as usize);
    store.write(0, &first).unwrap();

    // A write into a present area, then a read, each with its copy failing.
    fails_with_eio("cuMemcpyHtoDAsync", || store.write(CHUNK + 4096, &pattern(2, 64 << 10)));
    fails_with_eio("cuMemcpyDtoHAsync", || store.read(0, &mut vec![0u8; 32 << 10]));
    // Bytes outside the failed write's own range are untouched; retried, it succeeds.
    check(&store, 0, &first[..(CHUNK + 4096) as usize]);
    let after = (CHUNK + 4096 + (64 << 10)) as usize;
    check(&store, after as u64, &first[after..]);
    let second = pattern(3, 64 << 10);
    store.write(CHUNK + 4096, &second).unwrap();
    check(&store, CHUNK + 4096, &second);

    // The first write to a fresh area fails as its chunk is mapped: the area stays empty.
    let live = store.stats().areas_live;
    fails_with_eio("cuMemMap", || store.write(7 * CHUNK, &pattern(4, 4096)));
    assert_eq!(store.stats().areas_live, live, "no area left half-made");
    check(&store, 7 * CHUNK, &[0u8; 4096]);
    store.write(7 * CHUNK, &pattern(4, 4096)).unwrap();
    check(&store, 7 * CHUNK, &pattern(4, 4096));

    // And everything else as it was.
    check(&store, 0, &first[..(CHUNK + 4096) as usize]);
    check(&store, after as u64, &first[after..]);
}
