//! Runs the probe program (src/bin/probe.rs) as an unmodified CUDA program: with
//! libtiermem_preload.so preloaded, over the fake driver (crates/fakecuda) as `libcuda.so.1`.
//!
//! Cargo builds both libraries into the target folder's `deps/` before these tests run: the
//! preload library because this package's lib is a cdylib (and an rlib, which makes cargo build
//! it for integration tests), the fake because it is a dev-dependency of the same kind. So a
//! clean clone needs nothing beyond `cargo test`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The target folder's `deps/`, where this test binary and both libraries are.
fn deps() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent().expect("deps/").to_path_buf()
}

fn library(name: &str) -> PathBuf {
    let path = deps().join(name);
    assert!(path.is_file(), "{} was not built (cargo builds it with this package's tests)", path.display());
    path
}

pub fn preload_library() -> PathBuf {
    library("libtiermem_preload.so")
}

/// A folder holding `libcuda.so.1`, `libcuda.so` and `libnvidia-ml.so.1`, links to the fake
/// driver (which answers NVML's few calls too); one per test.
fn fake_driver_dir(test: &str) -> PathBuf {
    let fake = library("libtiermem_fakecuda.so");
    let dir = std::env::temp_dir().join(format!("tiermem-fakecuda-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    for name in ["libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1"] {
        std::os::unix::fs::symlink(&fake, dir.join(name)).expect("a link to the fake driver");
    }
    dir
}

/// Runs the probe with `args` and `env`, preloaded over the fake driver, with chunks of 2 MiB
/// (one granule) unless `env` sets `TIERMEM_CHUNK`.
#[allow(dead_code)] // not every test binary runs the probe to its end
pub fn probe(test: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let (mut command, dir) = probe_command(test, args, env);
    let output = command.output().expect("the probe runs");
    let _ = std::fs::remove_dir_all(&dir);
    output
}

/// The command [`probe`] runs, and the folder of the fake driver's links to remove once it ran.
pub fn probe_command(test: &str, args: &[&str], env: &[(&str, &str)]) -> (Command, PathBuf) {
    let dir = fake_driver_dir(test);
    let mut command = Command::new(env!("CARGO_BIN_EXE_tiermem-preload-probe"));
    command.args(args).env("LD_PRELOAD", preload_library()).env("LD_LIBRARY_PATH", library_path(&dir));
    for var in [
        "TIERMEM_HBM_LIMIT",
        "TIERMEM_STATS",
        "TIERMEM_STATS_JSON",
        "TIERMEM_FAKE_HBM",
        "TIERMEM_FAKE_HOST_CHUNKS",
        "TIERMEM_FAKE_EVENT_POLLS",
        "TIERMEM_DAEMON",
        "TIERMEM_VERIFY_MOVES",
        "TIERMEM_FAKE_GPUS",
        "TIERMEM_PEERS",
        "TIERMEM_PEER_RESERVE",
        "TIERMEM_PEER_LIMIT",
        "TIERMEM_PEER_CHECK_MS",
    ] {
        command.env_remove(var);
    }
    // No node daemon unless a test starts one (a daemon running on this machine stays out).
    command.env("TIERMEM_DAEMON", "off");
    // The probe counts chunks of one granule unless a test asks for others.
    command.env("TIERMEM_CHUNK", "2MiB");
    // Stage 3 throughout: its trial chooses by the fake driver's timing, which tests cannot
    // rely on (tests/segments.rs runs one).
    command.env("TIERMEM_STAGE3_TRIAL", "off");
    command.envs(env.iter().copied());
    (command, dir)
}

fn library_path(dir: &Path) -> std::ffi::OsString {
    let mut path = dir.as_os_str().to_owned();
    if let Some(rest) = std::env::var_os("LD_LIBRARY_PATH") {
        path.push(":");
        path.push(rest);
    }
    path
}

/// Asserts the probe passed, showing what it printed if not.
#[allow(dead_code)]
pub fn assert_passed(output: &Output) -> (String, String) {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "the probe failed ({}):\n{stdout}\n{stderr}", output.status);
    (stdout, stderr)
}

/// The number right after `marker` in `text` (the `--stats` lines), or a panic showing `text`.
#[allow(dead_code)] // not every test binary reads a number
pub fn number_after(text: &str, marker: &str) -> u64 {
    text.split(marker)
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number after {marker:?} in:\n{text}"))
}
