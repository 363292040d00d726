//! Stage 3: paging within a cycle. A loop over six buffers of 4 MiB under a budget of 16 MiB,
//! one synchronization per cycle: once a cycle is recorded, the next ones pause before the
//! segment that needs the buffers on the host and bring them in, so every launch finds its
//! pointers in HBM (the probe checks each, and every byte); cycles that diverge from the
//! recording fall back and are counted; with `TIERMEM_SEGMENTS=off`, stage 2 alone leaves a
//! third of the launches reading the host. A step of two different cycles is followed too, and
//! so is a step whose tensors are made and freed within it through the stream-ordered pool.

mod support;

const ENV: [(&str, &str); 5] = [
    ("TIERMEM_SEGMENTS", "on"),
    ("TIERMEM_HBM_LIMIT", "16MiB"),
    ("TIERMEM_FAKE_HBM", "256M"),
    ("TIERMEM_MIGRATE_INTERVAL_MS", "0"),
    ("TIERMEM_STATS", "1"),
];

/// The share of launches with tiermem pointers whose pointers were all in HBM, from `--stats`.
fn all_in_hbm_share(stderr: &str) -> f64 {
    for line in stderr.lines().filter(|l| l.contains("stats: ")) {
        eprintln!("{line}");
    }
    let line = stderr.lines().find(|l| l.contains("with tiermem pointers")).expect("the launches line");
    let percent = line.split(", ").nth(2).and_then(|part| part.split('%').next()).expect("a share");
    percent.trim().parse::<f64>().expect("a number") / 100.0
}

/// What stage 3's trial chose over 40 cycles of 24 launches (enough to be samples), with the
/// fake driver's timing set by `timing`: (trials that kept stage 3, trials that chose stage 2).
/// Every byte is checked by the probe through the changes of mode.
fn trial_with(test: &str, timing: (&str, &str)) -> (u64, u64) {
    let env = [ENV.as_slice(), &[("TIERMEM_STAGE3_TRIAL", "on"), timing]].concat();
    let output = support::probe(test, &["segments-trial"], &env);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("segments-trial: ok"), "{stdout}");
    let line = stderr.lines().find(|l| l.contains("stage 3 on trial")).unwrap_or_else(|| panic!("{stderr}"));
    eprintln!("{line}");
    (support::number_after(line, "kept "), support::number_after(line, "for stage 2 alone "))
}

#[test]
fn stage_3_on_trial_is_kept_where_stage_2_leaves_kernels_reading_the_host() {
    // Each pointer into a host chunk costs a kernel 3 ms: stage 2 alone leaves a third of the
    // launches reading the host, stage 3 none.
    assert_eq!(trial_with("trial-host-reads", ("TIERMEM_FAKE_HOST_READ_US", "3000")), (1, 0));
}

#[test]
fn stage_3_on_trial_is_set_aside_where_its_pauses_cost_more() {
    // Each context synchronization takes 8 ms: stage 3's pauses are what it costs.
    let (kept, chose) = trial_with("trial-slow-pauses", ("TIERMEM_FAKE_SYNC_US", "8000"));
    assert_eq!((kept, chose), (0, 1));
}

#[test]
fn a_loop_larger_than_the_budget_finds_its_buffers_in_hbm() {
    let output = support::probe("segments", &["segments"], &ENV);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("segments: ok"), "{stdout}");
    // 8 loop cycles (the first recorded), then two diverging cycles each followed by the loop
    // planned from them (which diverges too) and two more loops (module docs of the probe).
    assert!(stderr.contains("11 cycles followed to the end, 4 diverged"), "{stderr}");
    assert!(support::number_after(&stderr, "segments on: ") >= 10, "a pause per followed cycle: {stderr}");
    let share = all_in_hbm_share(&stderr);
    assert!(share > 0.9, "launches all in HBM: {share}\n{stderr}");
}

#[test]
fn moves_in_batches_of_one_are_pipelined() {
    // A pause's moves in rounds of one chunk each way: each round sends one down and brings
    // one up into the HBM that the round before the round before freed, while the round before
    // is remapped (rounds.rs); bytes checked as ever.
    let env: Vec<_> = ENV.iter().copied().chain([("TIERMEM_MIGRATE_BATCH", "1")]).collect();
    let output = support::probe("segments-batch-1", &["segments"], &env);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("segments: ok"), "{stdout}");
    assert!(stderr.contains("11 cycles followed to the end, 4 diverged"), "{stderr}");
    let share = all_in_hbm_share(&stderr);
    assert!(share > 0.9, "launches all in HBM: {share}\n{stderr}");
}

#[test]
fn on_by_default() {
    let env: Vec<_> = ENV.iter().copied().filter(|&(name, _)| name != "TIERMEM_SEGMENTS").collect();
    let output = support::probe("segments-default", &["segments"], &env);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("segments: ok") && stderr.contains("segments on: "), "{stdout}\n{stderr}");
}

#[test]
fn with_segments_off_stage_two_alone_leaves_launches_on_the_host() {
    let env: Vec<_> =
        ENV.iter().copied().map(|(k, v)| if k == "TIERMEM_SEGMENTS" { (k, "off") } else { (k, v) }).collect();
    let output = support::probe("segments-off", &["segments"], &env);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("segments: ok"), "{stdout}");
    assert!(stderr.contains("segments off: 0 pauses"), "{stderr}");
    let share = all_in_hbm_share(&stderr);
    assert!(share < 0.8, "launches all in HBM without segments: {share}\n{stderr}");
}

#[test]
fn two_cycles_a_step_are_told_apart() {
    let output = support::probe("segments-alternate", &["segments-alternate"], &ENV);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("segments-alternate: ok"), "{stdout}");
    // Until each cycle has followed the other twice in a row, the next cycle is planned as the
    // one before it, and diverges (4 times); then each is predicted as its successor.
    assert!(stderr.contains("11 cycles followed to the end, 4 diverged"), "{stderr}");
    let share = all_in_hbm_share(&stderr);
    assert!(share > 0.85, "launches all in HBM: {share}\n{stderr}");
}

#[test]
fn tensors_freed_within_a_step_are_planned_at_their_addresses() {
    // The probe asserts, from the third step on, that every launch finds its chunks in HBM, and
    // that every step gets its tensors back at the first step's addresses.
    let output = support::probe("segments-async", &["segments-async"], &ENV);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("segments-async: ok"), "{stdout}");
    // Kept frees are planned once the cycles are followed (from the fifth step): over the run,
    // 87.5% (the probe itself checks every launch from the sixth step on).
    let share = all_in_hbm_share(&stderr);
    assert!(share > 0.85, "launches all in HBM: {share}\n{stderr}");
}

#[test]
fn unplanned_kept_frees_stay_where_they_were_placed() {
    // TIERMEM_PLAN_KEPT=off: the tensor placed on the host at the first step stays there, and
    // the launches that use it read the host every step.
    let env: Vec<_> = ENV.iter().copied().chain([("TIERMEM_PLAN_KEPT", "off")]).collect();
    let output = support::probe("segments-async-off", &["segments-async"], &env);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("segments-async: ok"), "{stdout}");
    let share = all_in_hbm_share(&stderr);
    assert!(share < 0.75, "launches all in HBM with kept frees unplanned: {share}\n{stderr}");
}

/// The events of a `TIERMEM_TRACE` file, each line parsed.
fn trace_of(test: &str, segments: &str) -> Vec<serde_json::Value> {
    let path = std::env::temp_dir().join(format!("tiermem-trace-{}-{test}.jsonl", std::process::id()));
    let path_text = path.to_str().expect("a UTF-8 temporary path");
    let env: Vec<_> = ENV
        .iter()
        .copied()
        .map(|(k, v)| if k == "TIERMEM_SEGMENTS" { (k, segments) } else { (k, v) })
        .chain([("TIERMEM_TRACE", path_text)])
        .collect();
    let output = support::probe(test, &["segments"], &env);
    support::assert_passed(&output);
    let text = std::fs::read_to_string(&path).expect("the trace was written");
    let _ = std::fs::remove_file(&path);
    text.lines().map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))).collect()
}

#[test]
fn the_trace_shows_each_boundarys_moves_and_the_launches_that_read_the_host() {
    let events = trace_of("trace-on", "on");
    let opened = &events[0];
    assert_eq!(opened["event"], "opened", "{opened}");
    assert!(opened["pid"].as_u64() > Some(0) && opened["unix_s"].as_f64() > Some(1.7e9), "{opened}");
    let named = |name: &'static str| events.iter().filter(move |e| e["event"] == name);
    assert!(named("sync").count() >= 10, "a sync a cycle: {events:?}");
    let moves: Vec<_> = named("moves").collect();
    assert!(moves.len() >= 10, "a boundary's moves a cycle: {moves:?}");
    for m in &moves {
        let planned = m["up"].as_u64().unwrap() + m["down"].as_u64().unwrap();
        assert!(m["moved"].as_u64().unwrap() <= planned && m["phases_ms"]["copying"].is_number(), "{m}");
    }
    assert!(moves.iter().any(|m| m["moved"].as_u64().unwrap() > 0), "{moves:?}");
    let plan = named("plan").next().expect("each plan is traced");
    let (launches, in_hbm) = (plan["launches"].as_array().unwrap(), plan["in_hbm"].as_array().unwrap());
    assert!(plan["budget"].as_u64() > Some(0) && !launches.is_empty() && !in_hbm.is_empty(), "{plan}");
    assert!(launches.iter().flat_map(|l| l.as_array().unwrap()).all(|c| c.as_u64().unwrap() < in_hbm.len() as u64));
    let times: Vec<f64> = events.iter().map(|e| e["t_ms"].as_f64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "in order of time: {times:?}");
    // Without segments, a third of the launches read the host (above): each one is traced.
    let off = trace_of("trace-off", "off");
    let on_host: Vec<_> = off.iter().filter(|e| e["event"] == "launch_on_host").collect();
    assert!(!on_host.is_empty() && on_host.iter().all(|e| e["host_pointers"].as_u64() > Some(0)), "{off:?}");
}
