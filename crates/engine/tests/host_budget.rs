//! Host budgets (`Engine::set_host_budget`): what the host tier holds beyond a smaller budget
//! spills to the file tier (never below a floor of a few chunks), a larger budget lets
//! the tier grow again, and every byte survives. Runs on the GPU too.

mod support;

use support::{assert_contents, assert_no_leaks, fill, CHUNK};
use tiermem::{AllocOptions, EngineConfig, Target, Tier};

fn config(file_chunks: usize) -> EngineConfig {
    let path = support::file_tier_path("host-budget");
    EngineConfig { file: Some(path), file_limit: file_chunks * CHUNK, ..support::config() }
}

#[test]
fn a_smaller_budget_spills_to_the_file_and_a_larger_one_grows_back() {
    let (engine, sim) = support::engine(4, 16, config(64));
    let (id, _) = engine.alloc(12 * CHUNK, AllocOptions::default()).unwrap();
    let data = fill(&engine, id, 12 * CHUNK, 3);
    engine.page_out(Target::All).unwrap();
    let host = |engine: &tiermem::Engine| engine.stats().tiers[Tier::Host].clone();
    assert_eq!(host(&engine).used_bytes, 12 * CHUNK);
    assert_eq!(engine.stats().host_pinned_bytes, 16 * CHUNK, "one slab of the whole cap");

    assert_eq!(engine.set_host_budget(6 * CHUNK).unwrap(), 0, "the slab is still in use: nothing unpinned");
    assert!(host(&engine).used_bytes <= 6 * CHUNK, "{:?}", host(&engine));
    assert_eq!(host(&engine).capacity_bytes, 6 * CHUNK);
    assert!(engine.stats().tiers[Tier::File].used_bytes >= 6 * CHUNK);
    assert_contents(&engine, id, &data);

    // Nothing below the floor: the way from HBM to the file goes through it.
    engine.set_host_budget(0).unwrap();
    assert_eq!(host(&engine).capacity_bytes, tiermem::HOST_FLOOR * CHUNK);
    assert!(host(&engine).used_bytes <= tiermem::HOST_FLOOR * CHUNK);
    assert_contents(&engine, id, &data);

    engine.set_host_budget(64 * CHUNK).unwrap();
    assert_eq!(host(&engine).capacity_bytes, 16 * CHUNK, "never beyond the engine's own cap");
    assert_contents(&engine, id, &data); // pages everything in, a window of HBM at a time
    engine.page_out(Target::All).unwrap();
    assert!(host(&engine).used_bytes > 0, "the host tier is used again");
    assert_contents(&engine, id, &data);
    engine.free(id).unwrap();
    assert_no_leaks(engine, sim);
}

#[test]
fn without_a_file_tier_the_excess_stays_and_nothing_is_lost() {
    let (engine, sim) = support::engine(4, 16, support::config());
    let (id, _) = engine.alloc(8 * CHUNK, AllocOptions::default()).unwrap();
    let data = fill(&engine, id, 8 * CHUNK, 4);
    engine.page_out(Target::All).unwrap();
    assert_eq!(engine.set_host_budget(2 * CHUNK).unwrap(), 0);
    assert_eq!(engine.stats().tiers[Tier::Host].used_bytes, 8 * CHUNK, "nowhere to go: it stays");
    assert_contents(&engine, id, &data);
    engine.free(id).unwrap();
    assert_no_leaks(engine, sim);
}
