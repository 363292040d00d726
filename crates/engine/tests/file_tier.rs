//! The file tier under a host tier too small for the data: chunks spill to the file, come
//! back from it byte for byte, and a chunk the file already holds is never written twice.

mod support;

use support::{pattern, CHUNK};
use tiermem::{Access, AllocOptions, EngineConfig, Error, Region, StreamHandle, Target};

fn config(file_chunks: usize) -> (EngineConfig, std::path::PathBuf) {
    let path = support::file_tier_path("file-tier");
    (
        EngineConfig {
            file: Some(path.clone()),
            file_limit: file_chunks * CHUNK,
            batch_chunks: 4,
            ..support::config()
        },
        path,
    )
}

#[test]
fn data_larger_than_hbm_and_host_lives_in_the_file_and_comes_back() {
    let (config, path) = config(32);
    let (engine, sim) = support::engine(4, 4, config);
    let buffers: Vec<_> = (0..4u64)
        .map(|i| {
            let (id, _) = engine.alloc(4 * CHUNK, AllocOptions::default()).unwrap();
            engine.write(id, 0, &pattern(i, 4 * CHUNK)).unwrap();
            id
        })
        .collect();
    let stats = engine.stats();
    assert!(stats.transfers.file_writes > 0, "16 chunks over 4 of HBM and 4 of host: some must be in the file");
    assert!(stats.buffers.iter().map(|b| b.in_file).sum::<usize>() > 0);
    for (i, &id) in buffers.iter().enumerate() {
        let mut back = vec![0u8; 4 * CHUNK];
        for part in 0..4 {
            engine.read(id, part * CHUNK, &mut back[part * CHUNK..(part + 1) * CHUNK]).unwrap();
        }
        assert!(back == pattern(i as u64, 4 * CHUNK), "buffer {i} changed on its way through the file");
    }
    assert!(engine.stats().transfers.file_reads > 0);
    support::assert_no_leaks(engine, sim);
    assert!(!path.exists(), "the file outlived the engine");
}

#[test]
fn a_read_only_buffer_is_written_to_the_file_once() {
    let (config, _path) = config(16);
    let (engine, sim) = support::engine(4, 4, config);
    let (weights, _) = engine.alloc(2 * CHUNK, AllocOptions { read_only: true, ..Default::default() }).unwrap();
    let bytes = pattern(7, 2 * CHUNK);
    engine.write(weights, 0, &bytes).unwrap();
    engine.page_out_to_file(Target::Buffer(weights)).unwrap();
    let first = engine.stats().transfers.file_writes;
    assert_eq!(first, 2, "the first page-out to the file writes both chunks");
    for round in 0..3 {
        engine.acquire(&[Region::whole(weights)], Access::ReadOnly, StreamHandle(0)).unwrap();
        engine.release(&[Region::whole(weights)], StreamHandle(0)).unwrap();
        engine.page_out_to_file(Target::Buffer(weights)).unwrap();
        let s = engine.stats();
        assert_eq!(s.transfers.file_writes, first, "round {round}: an unchanged buffer was written again");
        assert_eq!(s.buffers[0].in_file, 2, "round {round}");
    }
    let mut back = vec![0u8; 2 * CHUNK];
    engine.read(weights, 0, &mut back[..CHUNK]).unwrap();
    engine.read(weights, CHUNK, &mut back[CHUNK..]).unwrap();
    assert!(back == bytes);
    support::assert_no_leaks(engine, sim);
}

#[test]
fn writing_a_chunk_makes_its_file_copy_stale() {
    let (config, _path) = config(16);
    let (engine, sim) = support::engine(4, 4, config);
    let (id, _) = engine.alloc(CHUNK, AllocOptions::default()).unwrap();
    engine.write(id, 0, &pattern(1, CHUNK)).unwrap();
    engine.page_out_to_file(Target::Buffer(id)).unwrap();
    engine.write(id, 100, &[0xEE; 64]).unwrap();
    engine.page_out_to_file(Target::Buffer(id)).unwrap();
    assert_eq!(engine.stats().transfers.file_writes, 2, "the changed chunk must be written again");
    let mut want = pattern(1, CHUNK);
    want[100..164].fill(0xEE);
    let mut back = vec![0u8; CHUNK];
    engine.read(id, 0, &mut back).unwrap();
    assert!(back == want);
    support::assert_no_leaks(engine, sim);
}

#[test]
fn full_tiers_are_out_of_memory_and_lose_nothing() {
    let (config, _path) = config(2);
    let (engine, sim) = support::engine(2, 2, config);
    // Each buffer fits in the tiers (2 + 2 + 2 chunks); both together do not.
    let ids: Vec<_> = (0..2).map(|_| engine.alloc(4 * CHUNK, AllocOptions::default()).unwrap().0).collect();
    let parts: Vec<(usize, usize)> = ids.iter().enumerate().flat_map(|(b, _)| (0..4).map(move |p| (b, p))).collect();
    let mut written = Vec::new();
    let mut failure = None;
    for &(b, part) in &parts {
        match engine.write(ids[b], part * CHUNK, &pattern((b * 10 + part) as u64, CHUNK)) {
            Ok(()) => written.push((b, part)),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let e = failure.expect("8 chunks cannot fit in 2 + 2 + 2");
    assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
    assert!(e.to_string().contains("file"), "the error names the file tier: {e}");
    // With every tier full nothing can move; once the second buffer is freed, every byte of
    // the first is there.
    assert!(written.iter().filter(|&&(b, _)| b == 0).count() == 4, "the first buffer was written whole");
    engine.free(ids[1]).unwrap();
    for part in 0..4 {
        let mut back = vec![0u8; CHUNK];
        engine.read(ids[0], part * CHUNK, &mut back).unwrap();
        assert!(back == pattern(part as u64, CHUNK), "chunk {part} of the first buffer was lost");
    }
    support::assert_no_leaks(engine, sim);
}

#[test]
fn page_out_to_file_without_a_file_tier_is_refused() {
    let (engine, sim) = support::engine(2, 2, support::config());
    let (a, _) = engine.alloc(CHUNK, AllocOptions::default()).unwrap();
    let e = engine.page_out_to_file(Target::Buffer(a)).unwrap_err();
    assert!(e.to_string().contains("TIERMEM_FILE"), "{e}");
    support::assert_no_leaks(engine, sim);
}

/// A page-out to the file right after a page-out still in flight writes what that page-out
/// copies down, not what its host slots held before (the write waits for the earlier copies).
#[test]
fn a_file_write_waits_for_an_earlier_page_out_still_copying() {
    for round in 0..4u64 {
        let (config, _path) = config(16);
        let (engine, sim) = support::engine(8, 8, config);
        let (a, _) = engine.alloc(6 * CHUNK, AllocOptions::default()).unwrap();
        let bytes = pattern(round, 6 * CHUNK);
        engine.write(a, 0, &bytes).unwrap();
        if let Some(sim) = &sim {
            sim.set_timing(tiermem::mechanism::sim::Timing::Lazy); // copies run only when waited for
        }
        let earlier = engine.page_out_start(Target::Buffer(a)).unwrap();
        let to_file = engine.page_out_to_file_start(Target::Buffer(a)).unwrap();
        engine.finish(to_file).unwrap();
        engine.finish(earlier).unwrap();
        assert_eq!(engine.stats().buffers[0].in_file, 6, "round {round}: every chunk is in the file");
        let mut back = vec![0u8; 6 * CHUNK];
        for part in 0..6 {
            engine.read(a, part * CHUNK, &mut back[part * CHUNK..(part + 1) * CHUNK]).unwrap();
        }
        assert!(back == bytes, "round {round}: the file holds bytes from before the page-out");
        support::assert_no_leaks(engine, sim);
    }
}

/// A page-out of more than the host tier holds goes down in rounds, each spilled to the file
/// before the next (waited for with the lock released, the call run again): when it returns
/// nothing of the buffer is in HBM, and every byte comes back.
#[test]
fn a_page_out_larger_than_the_host_tier_goes_down_in_rounds() {
    let (config, path) = config(16);
    let (engine, sim) = support::engine(8, 2, config);
    let (a, _) = engine.alloc(6 * CHUNK, AllocOptions::default()).unwrap();
    let bytes = support::fill(&engine, a, 6 * CHUNK, 7);
    engine.page_out(Target::Buffer(a)).unwrap();
    let stats = support::buffer_stats(&engine, a);
    assert_eq!((stats.in_hbm, stats.moving, stats.in_host, stats.in_file), (0, 0, 2, 4), "{stats:?}");
    support::assert_contents(&engine, a, &bytes);
    support::assert_no_leaks(engine, sim);
    assert!(!path.exists(), "the file outlived the engine");
}
