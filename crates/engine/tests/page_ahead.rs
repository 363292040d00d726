//! `Engine::page_ahead`: a page-in ahead of use that makes room where `prefetch` would find
//! none — taking what no schedule step uses first, then what is used furthest ahead, never the
//! current or the next step's buffers, an acquired chunk or what it brings in — and every byte
//! survives. Runs on the GPU too.

mod support;

use support::{assert_contents, assert_no_leaks, buffer_stats, fill, CHUNK};
use tiermem::{Access, AllocOptions, BufferId, Engine, EngineConfig, Region, StreamHandle, Target};

const S: StreamHandle = StreamHandle(0);

/// `n` buffers of one chunk with known contents, all paged out (each has a host copy, so
/// evicting one copies nothing).
fn buffers(engine: &Engine, n: usize) -> Vec<(BufferId, Vec<u8>)> {
    let made: Vec<_> = (0..n)
        .map(|i| {
            let (id, _) = engine.alloc(CHUNK, AllocOptions::default()).unwrap();
            (id, fill(engine, id, CHUNK, 40 + i as u64))
        })
        .collect();
    engine.page_out(Target::All).unwrap();
    made
}

/// The tests' engine, learning no loop from its acquires: a learned schedule would protect
/// the buffers these tests touch as "the current and the next step".
fn unscheduled() -> EngineConfig {
    EngineConfig { learn_loops: None, ..support::config() }
}

/// Acquires and releases `id`: it comes into HBM and was used last.
fn touch(engine: &Engine, id: BufferId) {
    let region = [Region::whole(id)];
    engine.acquire(&region, Access::ReadOnly, S).unwrap();
    engine.release(&region, S).unwrap();
}

/// Waits for the work on the stream: without a schedule only chunks the GPU has finished
/// with are taken.
fn settle(engine: &Engine) {
    engine.device().synchronize_stream(S).unwrap();
}

fn in_hbm(engine: &Engine, id: BufferId) -> bool {
    let stats = buffer_stats(engine, id);
    stats.in_hbm + stats.moving == 1
}

fn assert_all(engine: &Engine, all: &[(BufferId, Vec<u8>)]) {
    all.iter().for_each(|(id, data)| assert_contents(engine, *id, data));
}

#[test]
fn makes_room_where_prefetch_finds_none_taking_the_least_recently_used() {
    let (engine, sim) = support::engine(3, 16, unscheduled());
    let all = buffers(&engine, 4);
    let [a, b, c, wanted] = [all[0].0, all[1].0, all[2].0, all[3].0];
    [b, a, c].into_iter().for_each(|id| touch(&engine, id)); // HBM full; b used longest ago
    settle(&engine);
    engine.prefetch(&[Region::whole(wanted)]).unwrap();
    assert!(!in_hbm(&engine, wanted), "a prefetch never evicts");
    let before = engine.stats().transfers.evictions;
    engine.page_ahead(&[Region::whole(wanted)]).unwrap();
    assert!(in_hbm(&engine, wanted), "page_ahead makes room");
    assert!(!in_hbm(&engine, b), "the least recently used leaves");
    assert!(in_hbm(&engine, a) && in_hbm(&engine, c));
    assert_eq!(engine.stats().transfers.evictions - before, 1);
    assert_all(&engine, &all);
    assert_no_leaks(engine, sim);
}

#[test]
fn never_takes_an_acquired_chunk() {
    let (engine, sim) = support::engine(2, 16, unscheduled());
    let all = buffers(&engine, 3);
    let [held, other, wanted] = [all[0].0, all[1].0, all[2].0];
    touch(&engine, held);
    touch(&engine, other);
    let region = [Region::whole(held)];
    engine.acquire(&region, Access::ReadWrite, S).unwrap(); // used longest ago, but acquired
    settle(&engine);
    engine.page_ahead(&[Region::whole(wanted)]).unwrap();
    assert!(in_hbm(&engine, held) && in_hbm(&engine, wanted) && !in_hbm(&engine, other));
    engine.release(&region, S).unwrap();
    // With only acquired chunks in HBM it brings in nothing, and says nothing is wrong.
    let both = [Region::whole(held), Region::whole(wanted)];
    engine.acquire(&both, Access::ReadOnly, S).unwrap();
    engine.page_ahead(&[Region::whole(other)]).unwrap();
    assert!(!in_hbm(&engine, other));
    engine.release(&both, S).unwrap();
    assert_all(&engine, &all);
    assert_no_leaks(engine, sim);
}

#[test]
fn with_a_schedule_takes_what_no_step_uses_then_what_is_used_furthest_ahead() {
    let (engine, sim) = support::engine(4, 16, support::config());
    let all = buffers(&engine, 6);
    let [now, next, later, loose, wanted, more] = [0, 1, 2, 3, 4, 5].map(|i| all[i].0);
    engine.set_schedule(vec![vec![now], vec![next], vec![later]]).unwrap();
    [loose, later, next, now].into_iter().for_each(|id| touch(&engine, id));
    engine.advance(0, 0).unwrap();
    let before = engine.stats().transfers.evictions;
    engine.page_ahead(&[Region::whole(wanted), Region::whole(more)]).unwrap();
    assert!(in_hbm(&engine, wanted) && in_hbm(&engine, more), "room for both");
    assert!(!in_hbm(&engine, loose), "what no step uses leaves first");
    assert!(!in_hbm(&engine, later), "then what is used furthest ahead");
    assert!(in_hbm(&engine, now) && in_hbm(&engine, next), "never the current or the next step");
    // Now only the current and next steps' buffers and the two it brought in, still to be
    // used, are resident: nothing may leave for a buffer used after them.
    engine.page_ahead(&[Region::whole(later)]).unwrap();
    assert!(!in_hbm(&engine, later) && in_hbm(&engine, wanted) && in_hbm(&engine, more));
    touch(&engine, wanted);
    settle(&engine);
    engine.page_ahead(&[Region::whole(later)]).unwrap();
    assert!(in_hbm(&engine, later) && !in_hbm(&engine, wanted), "used, it leaves first");
    assert!(in_hbm(&engine, now) && in_hbm(&engine, next) && in_hbm(&engine, more));
    assert_eq!(engine.stats().transfers.evictions - before, 3);
    assert_all(&engine, &all);
    assert_no_leaks(engine, sim);
}

#[test]
fn what_it_paged_in_stays_until_used_then_leaves_first() {
    let (engine, sim) = support::engine(4, 16, support::config());
    let all = buffers(&engine, 5);
    let [now, next, later, first, second] = [0, 1, 2, 3, 4].map(|i| all[i].0);
    engine.set_schedule(vec![vec![now], vec![next], vec![later]]).unwrap();
    [later, next, now].into_iter().for_each(|id| touch(&engine, id));
    engine.advance(0, 0).unwrap();
    engine.page_ahead(&[Region::whole(first)]).unwrap(); // into the free chunk
    engine.page_ahead(&[Region::whole(second)]).unwrap();
    assert!(in_hbm(&engine, first), "paged in for use soon: kept like the next step's");
    assert!(in_hbm(&engine, second) && !in_hbm(&engine, later));
    engine.advance(0, 4 * CHUNK).unwrap(); // the schedule's own page-ahead takes neither
    assert!(in_hbm(&engine, first) && in_hbm(&engine, second));
    touch(&engine, first); // used: an unscheduled buffer like any other again
    settle(&engine); // (a victim the GPU is still using leaves without being waited for)
    engine.page_ahead(&[Region::whole(later)]).unwrap();
    assert!(in_hbm(&engine, later) && !in_hbm(&engine, first) && in_hbm(&engine, second));
    assert_all(&engine, &all);
    assert_no_leaks(engine, sim);
}

#[test]
fn bad_regions_are_refused_and_nothing_moves() {
    let (engine, sim) = support::engine(2, 16, support::config());
    let all = buffers(&engine, 1);
    let err = engine.page_ahead(&[Region { buffer: all[0].0, offset: 4 * CHUNK, len: Some(1) }]).unwrap_err();
    assert!(err.to_string().contains("page_ahead"), "{err}");
    assert!(!in_hbm(&engine, all[0].0));
    assert_all(&engine, &all);
    assert_no_leaks(engine, sim);
}
