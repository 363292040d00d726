//! A C program (tests/c/smoke.c) compiled against `include/tiermem.h`, linked with this
//! crate's shared library and run on the simulated device: the ABI as a C user sees it.
//! Skipped, saying so, where there is no C compiler.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory holding `libtiermem_capi.so`, built beside this test's executable.
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let deps = exe.parent().expect("target/<profile>/deps").to_path_buf();
    let profile = deps.parent().expect("target/<profile>").to_path_buf();
    [deps, profile]
        .into_iter()
        .find(|dir| dir.join("libtiermem_capi.so").exists())
        .unwrap_or_else(|| panic!("libtiermem_capi.so is not beside {}", exe.display()))
}

#[test]
fn a_c_program_allocates_moves_and_verifies_through_the_header() {
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    if Command::new(&compiler).arg("--version").output().is_err() {
        eprintln!("SKIPPED: no C compiler ({compiler}); set CC to run the C program test");
        return;
    }
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let libs = library_dir();
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join("tiermem_c_smoke");
    let compiled = Command::new(&compiler)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(here.join("tests/c/smoke.c"))
        .arg(format!("-I{}", here.join("include").display()))
        .arg(format!("-L{}", libs.display()))
        .arg(format!("-Wl,-rpath,{}", libs.display()))
        .arg("-ltiermem_capi")
        .output()
        .expect("run the C compiler");
    assert!(
        compiled.status.success(),
        "compiling tests/c/smoke.c failed:\n{}",
        String::from_utf8_lossy(&compiled.stderr)
    );

    let ran = Command::new(&exe).env_remove("TIERMEM_FILE").output().expect("run the C program");
    let (stdout, stderr) = (String::from_utf8_lossy(&ran.stdout), String::from_utf8_lossy(&ran.stderr));
    assert!(ran.status.success(), "the C program failed ({}):\n{stdout}\n{stderr}", ran.status);
    assert!(stdout.contains("tiermem C ABI: all checks passed"), "{stdout}\n{stderr}");
}
