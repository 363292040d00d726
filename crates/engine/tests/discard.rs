//! `Engine::discard`: the bytes of whole chunks given up with nothing copied — the next acquire
//! finds zeros without a page-in — while every byte the program still wants survives any
//! sequence of moves around it. Runs on the GPU too (`TIERMEM_TEST_BACKEND=cuda`).

mod support;

use support::{assert_contents, assert_hbm_accounted, buffer_stats, fill, pattern, CHUNK};
use tiermem::{Access, AllocOptions, BufferId, Engine, Error, Region, StreamHandle, Target, Tier};

const S: StreamHandle = StreamHandle(0);

fn alloc(engine: &Engine, size: usize) -> BufferId {
    engine.alloc(size, AllocOptions::default()).unwrap().0
}

/// The engine's counters after the GPU has finished what was queued (so moves have landed).
fn settled(engine: &Engine) -> tiermem::Stats {
    engine.device().synchronize_stream(S).unwrap();
    engine.prefetch(&[]).unwrap(); // any call reaps what has landed
    engine.stats()
}

#[test]
fn discarded_chunks_below_hbm_come_back_as_zeros_without_a_page_in() {
    let (engine, sim) = support::engine(4, 16, support::config());
    let a = alloc(&engine, 3 * CHUNK);
    fill(&engine, a, 3 * CHUNK, 1);
    engine.page_out(Target::Buffer(a)).unwrap();
    assert_eq!(engine.stats().tiers[Tier::Host].chunks, 3);
    assert_eq!(engine.discard(&[Region::whole(a)]).unwrap(), 3);
    let before = engine.stats();
    assert_eq!(before.tiers[Tier::Host].chunks, 0, "the host slots are free: {before}");
    assert_eq!(buffer_stats(&engine, a).empty, 3);
    engine.acquire(&[Region::whole(a)], Access::ReadWrite, S).unwrap();
    engine.release(&[Region::whole(a)], S).unwrap();
    let after = engine.stats().transfers;
    assert_eq!(after.page_ins, before.transfers.page_ins, "nothing was paged in");
    assert_eq!(after.zero_fills - before.transfers.zero_fills, 3);
    assert_eq!(after.discarded, 3);
    assert_contents(&engine, a, &vec![0; 3 * CHUNK]);
    support::assert_no_leaks(engine, sim);
}

#[test]
fn a_resident_chunk_leaves_hbm_without_being_copied_down() {
    let (engine, sim) = support::engine(4, 16, support::config());
    let (a, kept) = (alloc(&engine, 2 * CHUNK), alloc(&engine, 2 * CHUNK));
    fill(&engine, a, 2 * CHUNK, 2);
    let kept_bytes = fill(&engine, kept, 2 * CHUNK, 3);
    // Read once more through an acquire, so the chunk's last use is a stream's work.
    engine.acquire(&[Region::whole(a)], Access::ReadOnly, S).unwrap();
    engine.release(&[Region::whole(a)], S).unwrap();
    let page_outs = engine.stats().transfers.page_outs;
    assert_eq!(engine.discard(&[Region::whole(a)]).unwrap(), 2);
    let stats = settled(&engine);
    assert_eq!(stats.transfers.page_outs, page_outs, "dirty but discarded: nothing copied down");
    assert_eq!(stats.tiers[Tier::Hbm].chunks, 2, "only the kept buffer holds HBM: {stats}");
    assert_eq!(buffer_stats(&engine, a).empty, 2);
    assert_hbm_accounted(&engine);
    // Two new buffers take the freed HBM without evicting the kept one.
    let b = alloc(&engine, 2 * CHUNK);
    let b_bytes = fill(&engine, b, 2 * CHUNK, 4);
    assert_eq!(engine.stats().transfers.evictions, 0);
    assert_contents(&engine, kept, &kept_bytes);
    assert_contents(&engine, b, &b_bytes);
    assert_contents(&engine, a, &vec![0; 2 * CHUNK]);
    support::assert_no_leaks(engine, sim);
}

#[test]
fn only_chunks_wholly_inside_a_region_lose_their_bytes() {
    let (engine, sim) = support::engine(8, 16, support::config());
    let a = alloc(&engine, 3 * CHUNK);
    let mut a_bytes = fill(&engine, a, 3 * CHUNK, 5);
    let region = Region { buffer: a, offset: CHUNK / 2, len: Some(2 * CHUNK) };
    assert_eq!(engine.discard(&[region]).unwrap(), 1, "chunk 1 only: 0 and 2 are partly outside");
    a_bytes[CHUNK..2 * CHUNK].fill(0);
    assert_contents(&engine, a, &a_bytes);
    // A buffer's last chunk counts as whole when the region reaches the buffer's end.
    let odd = alloc(&engine, CHUNK + CHUNK / 2);
    fill(&engine, odd, CHUNK + CHUNK / 2, 6);
    assert_eq!(engine.discard(&[Region { buffer: odd, offset: CHUNK, len: None }]).unwrap(), 1);
    assert_eq!(engine.discard(&[Region { buffer: odd, offset: 1, len: Some(CHUNK) }]).unwrap(), 0);
    support::assert_no_leaks(engine, sim);
}

#[test]
fn bad_discards_are_refused_and_lose_nothing() {
    let (engine, sim) = support::engine(4, 16, support::config());
    let a = alloc(&engine, 2 * CHUNK);
    let a_bytes = fill(&engine, a, 2 * CHUNK, 7);
    engine.acquire(&[Region { buffer: a, offset: 0, len: Some(CHUNK) }], Access::ReadOnly, S).unwrap();
    let acquired = engine.discard(&[Region::whole(a)]).unwrap_err();
    assert!(matches!(acquired, Error::Acquired { call: "discard", pinned_chunks: 1, .. }), "{acquired}");
    engine.release(&[Region { buffer: a, offset: 0, len: Some(CHUNK) }], S).unwrap();
    let beyond = engine.discard(&[Region { buffer: a, offset: CHUNK, len: Some(2 * CHUNK) }]).unwrap_err();
    assert!(matches!(beyond, Error::OutOfRange { call: "discard", .. }), "{beyond}");
    let unknown = engine.discard(&[Region::whole(BufferId(9999))]).unwrap_err();
    assert!(matches!(unknown, Error::UnknownBuffer { call: "discard", .. }), "{unknown}");
    assert_eq!(engine.stats().transfers.discarded, 0);
    assert_contents(&engine, a, &a_bytes);
    support::assert_no_leaks(engine, sim);
}

/// A buffer reused as a scratch area — written afresh, read, discarded — beside buffers whose
/// bytes matter, under an HBM cap that forces moves every round: the kept bytes never change
/// and every scratch round reads back what it wrote.
#[test]
fn scratch_reused_beside_kept_buffers_loses_no_byte() {
    let (engine, sim) = support::engine(4, 32, support::config());
    let kept: Vec<(BufferId, Vec<u8>)> = (0..3)
        .map(|i| {
            let id = alloc(&engine, 2 * CHUNK);
            (id, fill(&engine, id, 2 * CHUNK, 10 + i))
        })
        .collect();
    let scratch: Vec<BufferId> = (0..3).map(|_| alloc(&engine, 2 * CHUNK)).collect();
    for round in 0..12u64 {
        for (i, &s) in scratch.iter().enumerate() {
            let bytes = pattern(100 + round * 3 + i as u64, 2 * CHUNK);
            engine.write(s, 0, &bytes).unwrap();
            let (k, k_bytes) = &kept[(i + round as usize) % kept.len()];
            assert_contents(&engine, *k, k_bytes);
            assert_contents(&engine, s, &bytes);
            if round % 3 != 2 {
                engine.discard(&[Region::whole(s)]).unwrap();
            }
        }
    }
    for (k, bytes) in &kept {
        assert_contents(&engine, *k, bytes);
    }
    assert_hbm_accounted(&engine);
    assert!(engine.stats().transfers.discarded > 0);
    support::assert_no_leaks(engine, sim);
}
