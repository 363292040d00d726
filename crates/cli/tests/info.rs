//! `tiermem info` on a simulated node of two GPUs: it says it is simulated, names GPU 1 as a
//! lender with how busy its kernels are and what holds its traffic, and both links for page-ins;
//! `tiermem --version` names the commit it was built from; `tiermem top` needs a terminal.

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

/// `tiermem --version` names the commit the binary was built from where it was built in a git
/// checkout (build.rs), so that results measured where there is no git still name it.
#[test]
fn the_version_names_the_commit_it_was_built_from() {
    let output = support::tiermem().arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&output.stdout).trim().to_string();
    assert!(output.status.success() && version.starts_with("tiermem 0."), "{version}");
    let head = std::process::Command::new("git").args(["rev-parse", "--short=7", "HEAD"]).output();
    match head.ok().filter(|o| o.status.success()) {
        Some(head) => {
            let head = String::from_utf8_lossy(&head.stdout).trim().to_string();
            assert!(version.ends_with(&format!("({head})")), "{version} against HEAD {head}");
        }
        None => eprintln!("not a git checkout: {version}"),
    }
}

/// `tiermem top` with its output piped (a script, CI) says it needs a terminal and what to use
/// instead, rather than failing on the terminal's setup.
#[test]
fn top_without_a_terminal_says_what_to_use_instead() {
    let output = support::tiermem().arg("top").env("TIERMEM_SOCKET", "/nonexistent/tiermemd.sock").output().unwrap();
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && said.contains("needs a terminal") && said.contains("tiermem status --json"),
        "{said}"
    );
}

/// The commands that talk to the daemon say the same when they find no socket: where they
/// looked, and what to start.
#[test]
fn without_a_daemon_status_top_and_lend_say_where_they_looked() {
    let empty = support::TempDir::new("no-daemon");
    if std::path::Path::new("/run/tiermem/tiermemd.sock").exists() {
        eprintln!("a system tiermemd runs here: nothing to check");
        return;
    }
    for command in [&["status"][..], &["top"], &["lend", "--gpu", "0"]] {
        let output = support::tiermem()
            .args(command)
            .env_remove("TIERMEM_SOCKET")
            .env("XDG_RUNTIME_DIR", &empty.0)
            .env("TIERMEM_BACKEND", "sim")
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{command:?}: {said}");
        assert!(
            said.contains("no tiermemd socket found (--socket, TIERMEM_SOCKET,")
                && said.contains("is `tiermem daemon` running?"),
            "{command:?}: {said}"
        );
        assert!(!said.contains("simulated"), "{command:?} looked for the socket after opening a device: {said}");
    }
}
