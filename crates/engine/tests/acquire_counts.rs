//! The engine counts acquires, refused ones included, and the largest asked for: a node
//! daemon tells a working tenant (even one waiting for its budget) from an idle one by them.

mod support;

use support::CHUNK;
use tiermem::{Access, AllocOptions, Error, Region, StreamHandle};

#[test]
fn acquires_are_counted_with_the_largest_even_when_refused() {
    let (engine, sim) = support::engine(4, 16, support::config());
    let (small, _) = engine.alloc(CHUNK, AllocOptions::default()).unwrap();
    let (large, _) = engine.alloc(3 * CHUNK, AllocOptions::default()).unwrap();
    let (huge, _) = engine.alloc(6 * CHUNK, AllocOptions::default()).unwrap();
    let counts = || (engine.stats().transfers.acquires, engine.stats().transfers.largest_acquire);
    assert_eq!(counts(), (0, 0));
    for (id, n) in [(small, 1), (large, 3), (small, 3)] {
        let region = [Region::whole(id)];
        engine.acquire(&region, Access::ReadWrite, StreamHandle(0)).unwrap();
        engine.release(&region, StreamHandle(0)).unwrap();
        assert_eq!(counts().1, n);
    }
    assert_eq!(counts(), (3, 3));
    // Larger than HBM: refused, but tried.
    let refused = engine.acquire(&[Region::whole(huge)], Access::ReadOnly, StreamHandle(0));
    assert!(matches!(refused, Err(Error::WouldNeverFit { .. })), "{refused:?}");
    assert_eq!(counts(), (4, 6));
    // Host reads go through an acquire too.
    engine.read(small, 0, &mut [0u8; 16]).unwrap();
    assert_eq!(counts().0, 5);
    for id in [small, large, huge] {
        engine.free(id).unwrap();
    }
    support::assert_no_leaks(engine, sim);
}
