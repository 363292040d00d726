//! Buffers side by side (`Engine::alloc_parts`): consecutive addresses, each part a buffer of
//! its own that moves and frees on its own, the reservation given back with the last part.
//! Runs on the GPU too.

mod support;

use support::{assert_contents, assert_no_leaks, engine, fill, CHUNK};
use tiermem::{Access, AllocOptions, Engine, Error, Region, StreamHandle, Target};

const S: StreamHandle = StreamHandle(0);

#[test]
fn parts_lie_side_by_side_from_chunk_boundaries() {
    let (engine, sim) = engine(4, 32, support::config());
    let sizes = [3 * CHUNK, CHUNK + 5, 2 * CHUNK];
    let parts = engine.alloc_parts(&sizes, AllocOptions::default()).unwrap();
    assert_eq!(parts.len(), 3);
    assert_eq!(parts[1].1, parts[0].1 + 3 * CHUNK as u64);
    assert_eq!(parts[2].1, parts[1].1 + 2 * CHUNK as u64, "a part ends at a chunk boundary");
    for (&(id, va), &size) in parts.iter().zip(&sizes) {
        assert_eq!(engine.device_ptr(id).unwrap(), va);
        assert_eq!(engine.stats().buffers.iter().find(|b| b.id == id).unwrap().size, size);
    }
    for &(id, _) in &parts {
        engine.free(id).unwrap();
    }
    assert_no_leaks(engine, sim);
}

/// Parts larger together than HBM, each acquired alone in turn (as experts are), keep every
/// byte through the moves; freed out of order, nothing is left behind.
#[test]
fn each_part_moves_alone_and_keeps_its_bytes() {
    let (engine, sim) = engine(4, 32, support::config());
    let sizes = [2 * CHUNK, 2 * CHUNK, 2 * CHUNK, CHUNK + 100];
    let parts = engine.alloc_parts(&sizes, AllocOptions::default()).unwrap();
    let data: Vec<Vec<u8>> = parts
        .iter()
        .zip(&sizes)
        .enumerate()
        .map(|(i, (&(id, _), &size))| fill(&engine, id, size, 40 + i as u64))
        .collect();
    for round in 0..3 {
        for (i, &(id, _)) in parts.iter().enumerate().skip(round % 2) {
            let region = [Region::whole(id)];
            engine.acquire(&region, Access::ReadOnly, S).unwrap();
            let in_hbm = engine.stats().buffers.iter().find(|b| b.id == id).unwrap().in_hbm;
            assert_eq!(in_hbm, sizes[i].div_ceil(CHUNK), "part {i} is resident whole while acquired");
            engine.release(&region, S).unwrap();
        }
    }
    engine.page_out(Target::All).unwrap();
    for (&(id, _), expected) in parts.iter().zip(&data) {
        assert_contents(&engine, id, expected);
    }
    for &i in &[2, 0, 3, 1] {
        engine.free(parts[i].0).unwrap();
        if i != 1 {
            assert_contents(&engine, parts[1].0, &data[1]);
        }
    }
    assert_no_leaks(engine, sim);
}

#[test]
fn bad_sizes_are_refused_and_nothing_is_reserved() {
    let (engine, sim) = engine(4, 8, support::config());
    let refused = |sizes: &[usize], engine: &Engine| engine.alloc_parts(sizes, AllocOptions::default()).unwrap_err();
    assert!(matches!(refused(&[], &engine), Error::ZeroSize { call: "alloc_parts" }));
    assert!(matches!(refused(&[CHUNK, 0], &engine), Error::ZeroSize { call: "alloc_parts" }));
    let too_big = refused(&[8 * CHUNK, 8 * CHUNK], &engine);
    assert!(matches!(too_big, Error::OutOfMemory { call: "alloc_parts", .. }), "{too_big}");
    assert!(engine.stats().buffers.is_empty());
    assert_no_leaks(engine, sim);
}

#[test]
fn parts_still_alive_go_with_the_engine() {
    let (engine, sim) = engine(4, 8, support::config());
    let parts = engine.alloc_parts(&[CHUNK, CHUNK, CHUNK], AllocOptions::default()).unwrap();
    fill(&engine, parts[1].0, CHUNK, 7);
    engine.free(parts[0].0).unwrap();
    assert_no_leaks(engine, sim);
}
