//! Stamps the binary with the commit it was built from (`TIERMEM_BUILT_FROM`, empty outside a
//! git checkout), so that a benchmark run where there is no git — the GPU machines, which get
//! the binaries alone — still names the commit it measured.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok().filter(|o| o.status.success())?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let commit = git(&["rev-parse", "--short=7", "HEAD"]).unwrap_or_default();
    println!("cargo:rustc-env=TIERMEM_BUILT_FROM={commit}");
    // Built again when HEAD moves: a new commit, or another branch checked out.
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={dir}/{branch}");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
