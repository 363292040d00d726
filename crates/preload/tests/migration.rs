//! Stage 2: chunks move at quiesce points. Under a budget of 16 MiB, an allocation that landed
//! on the host and is passed to kernels comes up at the next synchronization while a cold one
//! goes down, every byte intact, the books exact; nothing moves with `TIERMEM_MIGRATE=off`;
//! a failure injected mid-migration leaves its chunk where it was; kernels launched by other
//! threads while chunks move never reach one mid-move.

mod support;

const ENV: [(&str, &str); 3] =
    [("TIERMEM_HBM_LIMIT", "16MiB"), ("TIERMEM_FAKE_HBM", "256M"), ("TIERMEM_MIGRATE_INTERVAL_MS", "0")];

fn with(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    ENV.iter().chain(extra).copied().collect()
}

#[test]
fn hot_chunks_come_up_and_cold_ones_go_down_at_a_synchronization() {
    let output = support::probe("migrate", &["migrate"], &with(&[("TIERMEM_STATS", "1")]));
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("migrate: ok"), "{stdout}");
    assert!(
        stderr.contains("migration on: 4 chunks up, 4 down (16.00 MiB moved), 0 failed; 1 quiesce points taken"),
        "{stderr}"
    );
    // 10 launches on B by pointer, 5 with B's addresses inside a struct, 3 of a library kernel
    // with B's address in its second parameter; A never.
    assert!(stderr.contains("launches: 18 scanned, 18 with tiermem pointers, 0.0% of those all in HBM"), "{stderr}");
}

#[test]
fn a_program_that_never_synchronizes_gets_pauses_of_tiermems_own() {
    let env = with(&[("TIERMEM_STATS", "1"), ("TIERMEM_PAUSE_MS", "50")]);
    let output = support::probe("migrate-unsynchronized", &["migrate-unsynchronized"], &env);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("migrate-unsynchronized: ok"), "{stdout}");
    assert!(
        stderr.contains("migration on: 4 chunks up, 4 down (16.00 MiB moved), 0 failed; 1 quiesce points taken"),
        "{stderr}"
    );
    assert!(support::number_after(&stderr, "skipped; ") >= 1, "a pause of tiermem's own: {stderr}");
    // Off with 0: B stays on the host however long the program runs without synchronizing.
    let off = with(&[("TIERMEM_PAUSE_MS", "0"), ("TIERMEM_PROBE_PATIENCE_MS", "400")]);
    let output = support::probe("migrate-unsynchronized-off", &["migrate-unsynchronized"], &off);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("B never came up"),
        "with TIERMEM_PAUSE_MS=0 nothing moves: {stderr}"
    );
}

#[test]
fn a_graphs_replays_heat_what_its_capture_passed() {
    // Stage 2's hotness, with stage 3 on (replays are no launches of its cycles) and off.
    for (label, segments) in [("graphs", "on"), ("graphs-stage-2", "off")] {
        let env = with(&[("TIERMEM_STATS", "1"), ("TIERMEM_SEGMENTS", segments)]);
        let output = support::probe(label, &["graphs"], &env);
        let (stdout, stderr) = support::assert_passed(&output);
        assert!(stdout.contains("graphs: ok"), "{label}: {stdout}");
        assert!(stderr.contains("migration on: 4 chunks up, 4 down (16.00 MiB moved), 0 failed"), "{label}: {stderr}");
        assert!(stderr.contains("CUDA graphs: 1 captured with tiermem's pointers, "), "{label}: {stderr}");
        assert!(stderr.contains(", 0 of graphs not followed"), "{label}: {stderr}");
    }
}

#[test]
fn a_graphs_replays_heat_beside_a_cycle_of_eager_launches_with_nothing_to_move() {
    // Stage 3 follows the eager launch's cycle, which has nothing to move: the replays' heat is
    // still placed (before, the cycle's plan took the quiesce points and B stayed on the host).
    let env = with(&[("TIERMEM_STATS", "1"), ("TIERMEM_HBM_LIMIT", "18MiB")]);
    let output = support::probe("graphs-eager", &["graphs", "eager"], &env);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("graphs: ok"), "{stdout}");
    assert!(stderr.contains("migration on: 4 chunks up, 4 down (16.00 MiB moved), 0 failed"), "{stderr}");
    // One replay in the loop (B up at its synchronization), one after: both counted.
    assert!(
        stderr.contains("CUDA graphs: 1 captured with tiermem's pointers, 2 replays (2 counted for hotness"),
        "{stderr}"
    );
}

#[test]
fn chunks_of_several_granules_move_whole_and_a_short_last_one_by_its_size() {
    let env = with(&[("TIERMEM_STATS", "1"), ("TIERMEM_CHUNK", "6MiB")]);
    let output = support::probe("migrate-uneven", &["migrate-uneven"], &env);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("migrate-uneven: ok"), "{stdout}");
    assert!(stderr.contains("migration on: 2 chunks up, 2 down (20.00 MiB moved), 0 failed"), "{stderr}");
}

#[test]
fn with_migration_off_nothing_moves() {
    let output =
        support::probe("migrate-off", &["migrate"], &with(&[("TIERMEM_MIGRATE", "off"), ("TIERMEM_STATS", "1")]));
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("migrate: ok"), "{stdout}");
    assert!(stderr.contains("migration off: 0 chunks up, 0 down"), "{stderr}");
}

/// The `nth` call of `call` from the synchronization on fails: one move down fails, so one
/// move up finds no room; the rest complete, bytes intact (the probe checks them).
fn one_failure_mid_migration(test: &str, call: &str, nth: &str) {
    let output = support::probe(test, &["migrate-fail", call, nth], &with(&[("TIERMEM_STATS", "1")]));
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("migrate-fail: ok"), "{stdout}");
    assert!(stderr.contains("3 chunks up, 3 down (12.00 MiB moved), 1 failed"), "{stderr}");
}

#[test]
fn a_map_failing_mid_migration_leaves_that_chunk_where_it_was() {
    // Down: 4 maps at the new chunks' shadows, then one per remap: the 6th is the second remap's.
    one_failure_mid_migration("migrate-fail-map", "cuMemMap", "6");
}

#[test]
fn a_copy_failing_mid_migration_leaves_that_chunk_where_it_was() {
    one_failure_mid_migration("migrate-fail-copy", "cuMemcpyDtoDAsync_v2", "2");
}

#[test]
fn a_copy_that_loses_a_byte_is_caught_when_moves_are_checked() {
    // The second copy reports success with one byte wrong. Checked, that move is not made (as
    // a failed copy) and every byte stays the program's; unchecked, the probe finds the byte.
    let corrupt = ["migrate-fail", "cuMemcpyDtoDAsync_v2:corrupt", "2"];
    let env = with(&[("TIERMEM_STATS", "1"), ("TIERMEM_VERIFY_MOVES", "on")]);
    let output = support::probe("migrate-corrupt-checked", &corrupt, &env);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("migrate-fail: ok"), "{stdout}");
    assert!(stderr.contains("3 chunks up, 3 down (12.00 MiB moved), 1 failed"), "{stderr}");
    assert!(
        stderr.contains("move check (copied): chunk 0x") && stderr.contains("differs from its new chunk at +"),
        "{stderr}"
    );
    // Every move is checked twice (copied, remapped): 4 + 3 down, 3 + 3 up; one differed.
    assert!(stderr.contains("moves checked (TIERMEM_VERIFY_MOVES): 13 checks, 1 differed"), "{stderr}");
    // Unchecked, every move is made (4 each way) and the probe reads the wrong byte back.
    let unchecked = ["migrate-fail", "cuMemcpyDtoDAsync_v2:corrupt", "2", "4"];
    let output = support::probe("migrate-corrupt-unchecked", &unchecked, &with(&[("TIERMEM_STATS", "1")]));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("bytes read back differ"), "{stderr}");
}

#[test]
fn a_shadow_failing_mid_migration_leaves_that_chunk_where_it_was() {
    // The second chunk going down cannot be opened at its shadow: it stays, the others move.
    one_failure_mid_migration("migrate-fail-shadow", "cuMemSetAccess", "2");
}

#[test]
fn an_access_failing_mid_migration_leaves_those_chunks_where_they_were() {
    // Access is given once per new chunk at its shadow (four going down), then a run of
    // neighbouring chunks per call at the remapped addresses (A's four chunks going down are
    // neighbours: one call). That fifth call fails: all four moves down are undone, so nothing
    // comes up; bytes intact.
    let output = support::probe(
        "migrate-fail-access",
        &["migrate-fail", "cuMemSetAccess", "5", "0"],
        &with(&[("TIERMEM_STATS", "1")]),
    );
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("migrate-fail: ok"), "{stdout}");
    assert!(stderr.contains("0 chunks up, 0 down") && stderr.contains("4 failed"), "{stderr}");
}

#[test]
fn launches_on_other_threads_never_reach_a_chunk_mid_move() {
    let output = support::probe("migrate-threads", &["migrate-threads"], &with(&[("TIERMEM_STATS", "1")]));
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("migrate-threads: ok"), "{stdout}");
    let moved = stderr.lines().find(|l| l.contains("migration on:")).unwrap_or_default().to_string();
    assert!(!moved.contains(": 0 chunks up"), "the test is void unless chunks moved while threads launched: {moved}");
}

#[test]
fn stream_memory_operations_and_batched_copies_on_other_threads_are_never_lost_to_a_move() {
    let output = support::probe("stream-writes", &["stream-writes"], &with(&[("TIERMEM_STATS", "1")]));
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("stream-writes: ok"), "{stdout}");
    let moved = stderr.lines().find(|l| l.contains("migration on:")).unwrap_or_default().to_string();
    assert!(!moved.contains(": 0 chunks up"), "the test is void unless chunks moved while threads wrote: {moved}");
}

#[test]
fn a_device_reset_frees_every_allocation_and_the_program_starts_again_with_the_whole_budget() {
    let output = support::probe("reset", &["reset"], &with(&[("TIERMEM_STATS", "1")]));
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("reset: ok"), "{stdout}");
    assert!(stderr.contains(", 0 failed;"), "no move fails after the reset: {stderr}");
}

#[test]
fn nothing_moves_while_a_stream_capture_is_under_way() {
    let output = support::probe("migrate-capture", &["migrate-capture"], &with(&[("TIERMEM_STATS", "1")]));
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("migrate-capture: ok"), "{stdout}");
    assert!(stderr.contains("1 quiesce points taken"), "{stderr}");
}

#[test]
fn a_context_of_the_programs_own_is_waited_for_by_migrations_and_frees_what_was_made_in_it() {
    let output = support::probe("contexts", &["contexts"], &with(&[("TIERMEM_STATS", "1")]));
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("contexts: ok"), "{stdout}");
    assert!(stderr.contains(", 0 failed;"), "no move fails: {stderr}");
    assert!(!stderr.contains("chunks stay where they are"), "migration goes on: {stderr}");
}

#[test]
fn contexts_made_and_destroyed_on_other_threads_while_chunks_move_lose_nothing() {
    let output = support::probe("contexts-threads", &["contexts-threads"], &with(&[("TIERMEM_STATS", "1")]));
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("contexts-threads: ok"), "{stdout}");
    let moved = stderr.lines().find(|l| l.contains("migration on:")).unwrap_or_default().to_string();
    assert!(
        !moved.contains(": 0 chunks up"),
        "the test is void unless chunks moved while contexts came and went: {moved}"
    );
}
