//! `tiermem info` on a simulated node of two GPUs: it says it is simulated, names GPU 1 as a
//! lender with how busy its kernels are and what holds its traffic, and both links for page-ins.

mod support;

#[test]
fn info_names_the_lender_how_busy_it_is_and_the_links() {
    let output = support::tiermem()
        .arg("info")
        .env("TIERMEM_BACKEND", "sim")
        .env("TIERMEM_SIM_GPUS", "2")
        .env("TIERMEM_PEER_BUSY_RATE", "32GiB/s")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&output.stdout).to_string() + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "tiermem info failed:\n{log}");
    let lender = log.lines().find(|l| l.starts_with("peer tier") && l.contains("GPU 1 lends"));
    let lender = lender.unwrap_or_else(|| panic!("no lender line:\n{log}"));
    assert!(lender.contains("busy 0% now") && lender.contains("32.00 GiB/s"), "{lender}");
    assert!(log.contains("this GPU's link and those of GPUs [1]"), "{log}");
}
