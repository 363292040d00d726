//! Allocations under a budget of 64 MiB: within it in HBM, beyond it on the host, every byte
//! read back; bad frees and zero bytes answered as the driver answers them; nothing leaked.

mod support;

#[test]
fn allocations_beyond_the_budget_land_on_the_host_and_keep_their_bytes() {
    let env = [("TIERMEM_HBM_LIMIT", "64MiB"), ("TIERMEM_FAKE_HBM", "256M")];
    let output = support::probe("memory", &["memory"], &env);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("memory: ok"), "{stdout}");
    assert!(!stderr.contains("tiermem:"), "no complaint expected:\n{stderr}");
}

#[test]
fn stats_at_exit_say_what_went_where() {
    let env = [("TIERMEM_HBM_LIMIT", "64MiB"), ("TIERMEM_FAKE_HBM", "256M"), ("TIERMEM_STATS", "1")];
    let output = support::probe("stats", &["memory"], &env);
    let (_, stderr) = support::assert_passed(&output);
    // a (2 chunks), b (32 in HBM + 20 on the host), c (1 on the host; freed asynchronously and
    // taken back once, on the host again), the pitched one (1).
    assert!(
        stderr.contains("tiermem: stats: 5 allocations (3 with chunks on the host, 0 refused), 0 live at exit"),
        "{stderr}"
    );
    assert!(stderr.contains("HBM 0 B at exit, peak 64.00 MiB; host 0 B at exit, peak 42.00 MiB"), "{stderr}");
    assert!(stderr.contains("managed (passed through) 0 B at exit, peak 4.00 KiB"), "{stderr}");
    assert!(stderr.contains("async frees: 2 ordered on their streams, 1 taken back by a later allocation"), "{stderr}");
}

#[test]
fn the_default_budget_is_free_memory_less_the_reserve() {
    let output = support::probe("budget", &["budget", &(1usize << 30).to_string()], &[("TIERMEM_FAKE_HBM", "3G")]);
    support::assert_passed(&output);
}

#[test]
fn a_budget_may_be_a_share_of_the_gpu() {
    let env = [("TIERMEM_FAKE_HBM", "3G"), ("TIERMEM_HBM_LIMIT", "25%")];
    support::assert_passed(&support::probe("budget-share", &["budget", &(768usize << 20).to_string()], &env));
}

#[test]
fn a_budget_beyond_the_gpu_is_said_and_the_default_taken() {
    // 100 GiB of a 3 GiB GPU: cuMemGetInfo would report a GPU larger than it is.
    let env = [("TIERMEM_FAKE_HBM", "3G"), ("TIERMEM_HBM_LIMIT", "100GiB")];
    let output = support::probe("budget-beyond", &["budget", &(1usize << 30).to_string()], &env);
    let (_, stderr) = support::assert_passed(&output);
    assert!(stderr.contains("TIERMEM_HBM_LIMIT: 100.00 GiB is more than the GPU's 3.00 GiB"), "{stderr}");
}

#[test]
fn a_full_gpu_sends_the_rest_to_the_host_before_the_budget_does() {
    let env = [("TIERMEM_HBM_LIMIT", "64MiB"), ("TIERMEM_FAKE_HBM", "64M")];
    let output = support::probe("gpufull", &["gpu-full"], &env);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("gpu-full: ok"), "{stdout}");
    assert!(!stderr.contains("tiermem:"), "no complaint expected:\n{stderr}");
}

#[test]
fn small_allocations_that_fit_are_the_drivers_counted_against_the_budget() {
    let env = [("TIERMEM_HBM_LIMIT", "64MiB"), ("TIERMEM_FAKE_HBM", "256M")];
    let output = support::probe("small", &["small"], &env);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("small: ok"), "{stdout}");
    assert!(!stderr.contains("tiermem:"), "no complaint expected:\n{stderr}");
}

#[test]
fn nvml_reports_the_budget_like_cu_mem_get_info() {
    let env = [("TIERMEM_HBM_LIMIT", "64MiB"), ("TIERMEM_FAKE_HBM", "256M")];
    let output = support::probe("nvml", &["nvml"], &env);
    let (stdout, _) = support::assert_passed(&output);
    assert!(stdout.contains("nvml: ok"), "{stdout}");
}

#[test]
fn the_default_pool_is_tiermems_other_pools_the_drivers() {
    let output = support::probe("pools", &["pools"], &[("TIERMEM_HBM_LIMIT", "16MiB")]);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("pools: ok"), "{stdout}\n{stderr}");
}

#[test]
fn a_chunk_of_the_programs_gets_hbm_by_sending_tiermems_coldest_chunks_to_the_host() {
    let output = support::probe("vmm-room", &["vmm-room"], &[("TIERMEM_HBM_LIMIT", "16MiB"), ("TIERMEM_STATS", "1")]);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("vmm-room: ok"), "{stdout}\n{stderr}");
    let said = "own VMM chunks (cuMemCreate): 4.00 MiB made in HBM (4.00 MiB of it where tiermem sent chunks";
    assert!(stderr.contains(said), "--stats says so: {stderr}");
}

#[test]
fn the_programs_own_vmm_chunks_count_against_the_budget_and_beyond_it_live_on_the_host() {
    let output = support::probe("vmm", &["vmm"], &[("TIERMEM_HBM_LIMIT", "16MiB"), ("TIERMEM_STATS", "1")]);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("vmm: ok"), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(
            "the program's own VMM chunks (cuMemCreate): 16.00 MiB made in HBM (0 B of it where tiermem sent chunks of \
             its own to the host to make room), 4.00 MiB on the host beyond the budget"
        ),
        "{stderr}"
    );
    for env in [
        [("TIERMEM_HBM_LIMIT", "16MiB"), ("TIERMEM_FAKE_HOST_CHUNKS", "0")],
        [("TIERMEM_HBM_LIMIT", "16MiB"), ("TIERMEM_PROGRAM_VMM", "hbm")],
    ] {
        let output = support::probe("vmm-no-host", &["vmm-no-host"], &env);
        let (stdout, stderr) = support::assert_passed(&output);
        assert!(stdout.contains("vmm: ok"), "{env:?}: {stdout}\n{stderr}");
    }
    // Off: passed through uncounted, the budget untouched.
    let env = [("TIERMEM_HBM_LIMIT", "16MiB"), ("TIERMEM_PROGRAM_VMM", "off"), ("TIERMEM_STATS", "1")];
    let output = support::probe("vmm-off", &["vmm-off"], &env);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("vmm-off: ok") && !stderr.contains("own VMM"), "{stdout}\n{stderr}");
}

#[test]
fn an_async_free_is_ordered_on_its_stream_not_waited_for() {
    let env = [("TIERMEM_HBM_LIMIT", "16MiB"), ("TIERMEM_FAKE_EVENT_POLLS", "10")];
    let output = support::probe("free-async", &["free-async"], &env);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("free-async: ok"), "{stdout}\n{stderr}");
}

#[test]
fn what_a_cuda_graph_captured_is_kept_through_pytorchs_allocator_and_cumemallocasync() {
    let env = [("TIERMEM_HBM_LIMIT", "16MiB"), ("TIERMEM_FAKE_EVENT_POLLS", "10"), ("TIERMEM_STATS", "1")];
    let output = support::probe("torch-graphs", &["torch-graphs"], &env);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("torch-graphs: ok"), "{stdout}\n{stderr}");
    assert!(!stderr.contains("tiermem_torch"), "nothing refused: {stderr}");
    // The torch route's three, then cuMemFreeAsync's two (a during the capture, b after it).
    assert!(
        stderr.contains("5 allocation(s) made or freed during CUDA-graph captures kept for the graphs (20.00 MiB"),
        "{stderr}"
    );
}

#[test]
fn pytorchs_pluggable_allocator_gets_tiermems_allocations_in_stream_order() {
    let env = [("TIERMEM_HBM_LIMIT", "16MiB"), ("TIERMEM_FAKE_EVENT_POLLS", "10")];
    let output = support::probe("torch-allocator", &["torch-allocator"], &env);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("torch-allocator: ok"), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("tiermem_torch_malloc: asked for GPU 1 while GPU 0's context is current; refused"),
        "{stderr}"
    );
    assert!(stderr.contains("tiermem_torch_malloc: a size of -1 B; refused (NULL)"), "{stderr}");
    assert!(!stderr.contains("tiermem_torch_free"), "every free went through: {stderr}");
}
