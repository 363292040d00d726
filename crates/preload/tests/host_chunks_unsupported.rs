//! A driver without host-located VMM chunks: beyond the budget, `cuMemAlloc_v2` answers
//! `CUDA_ERROR_OUT_OF_MEMORY` as the driver would, says why once on stderr, and leaks nothing.

mod support;

#[test]
fn beyond_the_budget_is_out_of_memory() {
    let env = [("TIERMEM_HBM_LIMIT", "8MiB"), ("TIERMEM_FAKE_HOST_CHUNKS", "0")];
    let output = support::probe("nohost", &["no-host-chunks"], &env);
    let (stdout, stderr) = support::assert_passed(&output);
    assert!(stdout.contains("no-host-chunks: ok"), "{stdout}");
    assert!(stderr.contains("tiermem: cuMemAlloc_v2: 8388608 B do not fit in the budget and"), "{stderr}");
    assert!(stderr.contains("raise --hbm-limit"), "{stderr}");
}
