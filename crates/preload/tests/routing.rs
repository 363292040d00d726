//! Which door gives which function: `dlsym` on libcuda's handle and on `RTLD_DEFAULT`,
//! `cuGetProcAddress_v2` with versions and stream flavours, and the driver's own refusals.

mod support;

#[test]
fn routed_functions_are_tiermem_s_and_the_rest_the_driver_s() {
    let output = support::probe("routing", &["routing"], &[]);
    let (stdout, _) = support::assert_passed(&output);
    assert!(stdout.contains("routing: ok"), "{stdout}");
}
