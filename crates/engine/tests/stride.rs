//! Stride prefetch (stride.rs): a buffer acquired chunk after chunk, in one direction, gets its
//! next chunks brought in before they are asked for — into free HBM only, never with a
//! schedule set, never when turned off — and every byte stays as written.

mod support;

use support::{assert_contents, fill, CHUNK};
use tiermem::{Access, AllocOptions, EngineConfig, Region, StreamHandle, Target};

const S: StreamHandle = StreamHandle(0);

/// An engine with room for 24 chunks in HBM and a buffer of 40 in the host tier.
type Sim = Option<std::sync::Arc<tiermem::mechanism::sim::SimDevice>>;

fn walked(config: EngineConfig) -> (tiermem::Engine, Sim, tiermem::BufferId, Vec<u8>) {
    let (engine, sim) = support::engine(24, 64, config);
    let (buffer, _) = engine.alloc(40 * CHUNK, AllocOptions::default()).unwrap();
    let data = fill(&engine, buffer, 40 * CHUNK, 3);
    engine.page_out(Target::All).unwrap();
    (engine, sim, buffer, data)
}

fn touch(engine: &tiermem::Engine, buffer: tiermem::BufferId, chunk: usize) {
    let region = [Region::bytes(buffer, chunk * CHUNK, CHUNK)];
    engine.acquire(&region, Access::ReadOnly, S).unwrap();
    engine.release(&region, S).unwrap();
}

fn in_hbm(engine: &tiermem::Engine) -> usize {
    engine.stats().buffers[0].in_hbm
}

#[test]
fn a_walk_forwards_brings_in_the_next_32_mib_ahead_of_use() {
    let (engine, sim, buffer, data) = walked(support::config());
    touch(&engine, buffer, 0);
    touch(&engine, buffer, 1);
    assert_eq!(in_hbm(&engine), 2, "two acquires are no walk yet");
    touch(&engine, buffer, 2);
    assert_eq!(engine.stats().transfers.prefetched, 16, "chunks 3..19 come in");
    assert_eq!(in_hbm(&engine), 3 + 16);
    let page_ins = engine.stats().transfers.page_ins;
    touch(&engine, buffer, 3);
    assert_eq!(engine.stats().transfers.page_ins - page_ins, 1, "only what the next window still lacks, as prefetch");
    assert_contents(&engine, buffer, &data);
    support::assert_no_leaks(engine, sim);
}

#[test]
fn a_walk_backwards_is_seen_too_and_free_hbm_bounds_it() {
    let (engine, sim, buffer, data) = walked(support::config());
    for chunk in [39, 38, 37] {
        touch(&engine, buffer, chunk);
    }
    assert_eq!(in_hbm(&engine), 3 + 16, "chunks 21..37 came in");
    for chunk in (30..37).rev() {
        touch(&engine, buffer, chunk);
    }
    assert!(in_hbm(&engine) <= 24, "never beyond the HBM cap");
    assert_contents(&engine, buffer, &data);
    support::assert_no_leaks(engine, sim);
}

#[test]
fn no_prefetch_when_off_when_scheduled_or_for_random_acquires() {
    let off = EngineConfig { stride_prefetch: 0, ..support::config() };
    let (engine, sim, buffer, _) = walked(off);
    (0..6).for_each(|c| touch(&engine, buffer, c));
    assert_eq!(engine.stats().transfers.prefetched, 0);
    support::assert_no_leaks(engine, sim);

    let (engine, sim, buffer, _) = walked(support::config());
    engine.set_schedule(vec![vec![buffer]]).unwrap();
    (0..6).for_each(|c| touch(&engine, buffer, c));
    assert_eq!(engine.stats().transfers.prefetched, 0, "a schedule pages ahead by advance instead");
    support::assert_no_leaks(engine, sim);

    let (engine, sim, buffer, data) = walked(support::config());
    [5, 30, 2, 17, 9, 33].into_iter().for_each(|c| touch(&engine, buffer, c));
    assert_eq!(engine.stats().transfers.prefetched, 0, "jumps are no walk");
    assert_contents(&engine, buffer, &data);
    support::assert_no_leaks(engine, sim);
}
