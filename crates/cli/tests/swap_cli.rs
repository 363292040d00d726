//! `tiermem swap` as a program: argument errors, `status` and `off` when nothing runs, and the
//! server's life with FUSE files only (`--no-loop --store memory`, hidden test options: no loop
//! device and no swap is ever set up here): on, I/O through its files, status, limits, cap, a
//! second `on` refused, off; and `kill -9` of the server, after which its files answer ENOTCONN
//! and `off` cleans up. The server tests need root and a machine that lets them mount FUSE;
//! elsewhere they print why they are skipped.

use serde_json::Value;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn tiermem(run_dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tiermem"))
        .args(args)
        .env("TIERMEM_RUN_DIR", run_dir)
        .output()
        .expect("runs tiermem")
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// A run directory of its own; whatever a test leaves running there is stopped and unmounted.
struct RunDir(PathBuf);

impl RunDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("tiermem-swap-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        RunDir(dir)
    }

    fn state(&self) -> Option<Value> {
        serde_json::from_str(&std::fs::read_to_string(self.0.join("state.json")).ok()?).ok()
    }

    fn mounted(&self) -> bool {
        let mountpoint = self.0.join("mnt");
        std::fs::read_to_string("/proc/self/mounts")
            .unwrap()
            .lines()
            .any(|l| l.split(' ').nth(1) == Some(mountpoint.to_str().unwrap()))
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = tiermem(&self.0, &["swap", "off", "--timeout", "30"]);
        if self.mounted() {
            let _ = Command::new("umount").arg("-l").arg(self.0.join("mnt")).status();
        }
        if !self.mounted() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn argument_errors_are_clear_and_start_nothing() {
    let run = RunDir::new("args");
    let cases: &[(&[&str], &str)] = &[
        (&["swap", "on"], "--size"),
        (&["swap", "on", "--size", "lots"], "is not a size"),
        (&["swap", "on", "--size", "0"], "--size must be more than 0"),
        (&["swap", "on", "--size", "16MiB"], "less than 16 MiB each"),
        (&["swap", "on", "--size", "1GiB", "--devices", "0"], "0 is not in 1..=16"),
        (&["swap", "on", "--size", "1GiB", "--devices", "17"], "17 is not in 1..=16"),
        (&["swap", "on", "--size", "1GiB", "--priority", "40000"], "40000 is not in 0..=32767"),
        (&["swap", "on", "--size", "1GiB", "--priority=-5"], "-5 is not in 0..=32767"),
        (&["swap", "on", "--size", "1GiB", "--soft-limit", "1GiB", "--hard-limit", "2GiB"], "is above --soft-limit"),
        (&["swap", "on", "--size", "1GiB", "--soft-limit", "1GiB", "--hard-limit", "none"], "is not a size"),
        (&["swap", "on", "--size", "1GiB", "--store", "disk"], "engine or memory"),
        (&["swap", "off", "--timeout", "soon"], "--timeout"),
        (&["swap", "cap"], "<SIZE>"),
        (&["swap", "cap", "lots"], "is not a size"),
    ];
    for (args, expected) in cases {
        let output = tiermem(&run.0, args);
        assert!(!output.status.success(), "{args:?} should fail: {}", text(&output));
        assert!(text(&output).contains(expected), "{args:?}: expected {expected:?} in: {}", text(&output));
    }
    assert!(run.state().is_none() && !run.mounted(), "nothing was started");
}

#[test]
fn status_off_limits_and_cap_when_nothing_runs() {
    let run = RunDir::new("idle");
    let status = tiermem(&run.0, &["swap", "status"]);
    assert!(status.status.success(), "{}", text(&status));
    assert_eq!(String::from_utf8_lossy(&status.stdout).trim(), "tiermem swap: off");
    let json = tiermem(&run.0, &["swap", "status", "--json"]);
    assert!(json.status.success(), "{}", text(&json));
    let value: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(value, serde_json::json!({"running": false}));
    if is_root() {
        let off = tiermem(&run.0, &["swap", "off"]);
        assert!(off.status.success(), "{}", text(&off));
        assert!(text(&off).contains("already off"), "{}", text(&off));
    }
    for args in [&["swap", "limits", "--soft", "1GiB"][..], &["swap", "cap", "0"]] {
        let output = tiermem(&run.0, args);
        assert!(!output.status.success());
        assert!(text(&output).contains("swap is off"), "{args:?}: {}", text(&output));
    }
}

/// `swap on` with FUSE files only, or `None` (and why) where this machine cannot.
fn start_fuse_only(run: &RunDir) -> Option<Vec<PathBuf>> {
    if !is_root() {
        eprintln!("SKIPPED: the server needs root");
        return None;
    }
    let on = tiermem(&run.0, &["swap", "on", "--size", "64MiB", "--no-loop", "--store", "memory", "--threads", "2"]);
    if !on.status.success() {
        let why = text(&on);
        assert!(why.contains("mounting the FUSE server"), "swap on failed for another reason: {why}");
        eprintln!("SKIPPED: this machine does not let the server mount FUSE: {why}");
        return None;
    }
    let files: Vec<PathBuf> = String::from_utf8_lossy(&on.stdout).lines().map(PathBuf::from).collect();
    assert_eq!(files, [run.0.join("mnt/swap0"), run.0.join("mnt/swap1")], "{}", text(&on));
    Some(files)
}

fn server_pid(run: &RunDir) -> i32 {
    run.state().expect("a state file")["pid"].as_i64().unwrap() as i32
}

/// Whether any thread of `pid` still runs: a killed process's leader is a zombie while its other
/// threads still end (closing the FUSE connection, releasing the run directory's lock), and an
/// unreaped zombie (no init to reap it in a container) has only its leader left.
fn alive(pid: i32) -> bool {
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat")).map(|stat| stat.contains(") Z "));
    match zombie {
        Err(_) => false,
        Ok(false) => true,
        Ok(true) => std::fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|threads| threads.count() > 1),
    }
}

#[test]
fn a_fuse_only_server_starts_serves_reports_and_stops() {
    let run = RunDir::new("life");
    let Some(files) = start_fuse_only(&run) else { return };
    let pid = server_pid(&run);

    let data: Vec<u8> = (0..3 << 20).map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&files[1]).unwrap();
    file.write_all_at(&data, 1 << 20).unwrap();
    let mut back = vec![0u8; data.len()];
    file.read_exact_at(&mut back, 1 << 20).unwrap();
    assert!(back == data);
    drop(file);

    let again = tiermem(&run.0, &["swap", "on", "--size", "64MiB", "--no-loop", "--store", "memory"]);
    assert!(!again.status.success());
    assert!(text(&again).contains("already on"), "{}", text(&again));

    let status = tiermem(&run.0, &["swap", "status", "--json"]);
    assert!(status.status.success(), "{}", text(&status));
    let s: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(s["running"], true);
    assert_eq!(s["pid"], pid);
    assert_eq!(s["size_bytes"], 64 << 20);
    assert_eq!(s["swap_enabled"], false);
    assert_eq!(s["devices"].as_array().unwrap().len(), 2);
    assert_eq!(s["devices"][1]["offset_bytes"], 32 << 20);
    assert_eq!(s["store"]["present_bytes"], 3 << 20);
    assert!(s["requests"]["writes"]["bytes"].as_u64().unwrap() >= 3 << 20, "{s}");
    assert_eq!(s["requests"]["errors"], 0);
    assert!(s["process"]["locked_bytes"].as_u64().unwrap() > 0, "mlockall: {s}");
    let human = tiermem(&run.0, &["swap", "status"]);
    assert!(String::from_utf8_lossy(&human.stdout).contains("tiermem swap: on, pid"), "{}", text(&human));

    let limits = tiermem(&run.0, &["swap", "limits", "--soft", "8MiB", "--hard", "4MiB"]);
    assert!(limits.status.success(), "{}", text(&limits));
    let limits = tiermem(&run.0, &["swap", "limits", "--soft", "16MiB"]);
    assert!(limits.status.success(), "{}", text(&limits));
    assert!(text(&limits).contains("soft 16.00 MiB, hard 4.00 MiB"), "{}", text(&limits));
    let bad = tiermem(&run.0, &["swap", "limits", "--hard", "32MiB"]);
    assert!(!bad.status.success() && text(&bad).contains("must not exceed"), "{}", text(&bad));
    let cap = tiermem(&run.0, &["swap", "cap", "0", "--json"]);
    assert!(cap.status.success(), "{}", text(&cap));
    let reply: Value = serde_json::from_slice(&cap.stdout).unwrap();
    assert!(reply["seconds"].is_number(), "{reply}");
    let s: Value =
        serde_json::from_slice(&tiermem(&run.0, &["swap", "status", "--json"]).stdout).expect("status after limits");
    assert_eq!(s["store"]["soft_limit_bytes"], 16 << 20);
    assert_eq!(s["store"]["hard_limit_bytes"], 4 << 20);
    assert_eq!(s["store"]["cap_bytes"], 0);

    let off = tiermem(&run.0, &["swap", "off"]);
    assert!(off.status.success(), "{}", text(&off));
    assert!(!run.mounted(), "unmounted");
    assert!(run.state().is_none(), "state removed");
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!alive(pid), "the server exited");
    let status = tiermem(&run.0, &["swap", "status"]);
    assert_eq!(String::from_utf8_lossy(&status.stdout).trim(), "tiermem swap: off");
}

#[test]
fn off_cleans_up_after_a_server_killed_with_sigkill() {
    let run = RunDir::new("kill");
    let Some(files) = start_fuse_only(&run) else { return };
    let pid = server_pid(&run);
    // SAFETY: kill takes integers only; the pid is the server this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }

    // What a loop device over these files would get: the dead mount answers ENOTCONN
    // (ECONNABORTED while the kernel is still tearing the connection down).
    let err = std::fs::File::open(&files[0]).map(|f| f.read_at(&mut [0u8; 4096], 0)).and_then(|r| r).unwrap_err();
    assert!(matches!(err.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED)), "{err}");

    let status = tiermem(&run.0, &["swap", "status"]);
    assert!(!status.status.success());
    assert!(text(&status).contains("died"), "{}", text(&status));
    let on = tiermem(&run.0, &["swap", "on", "--size", "64MiB", "--no-loop", "--store", "memory"]);
    assert!(!on.status.success());
    assert!(text(&on).contains("swap off` first"), "{}", text(&on));

    let off = tiermem(&run.0, &["swap", "off"]);
    assert!(off.status.success(), "{}", text(&off));
    assert!(text(&off).contains("is gone: cleaning up"), "{}", text(&off));
    assert!(!run.mounted(), "unmounted");
    assert!(run.state().is_none(), "state removed");

    // And it starts again.
    assert!(start_fuse_only(&run).is_some());
    let off = tiermem(&run.0, &["swap", "off"]);
    assert!(off.status.success(), "{}", text(&off));
}

fn tiermem_sim(run_dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tiermem"))
        .args(args)
        .env("TIERMEM_RUN_DIR", run_dir)
        .env("TIERMEM_BACKEND", "sim")
        .output()
        .expect("runs tiermem")
}

/// The engine's store (on the simulated device): a size the tiers cannot hold is the store's
/// clear error; a spill file that exists is refused; I/O, a forced cap, and after `kill -9`
/// `off` removes the spill file the dead server left.
#[test]
fn the_engine_store_behind_the_server_and_its_spill_file() {
    let run = RunDir::new("engine");
    if !is_root() {
        eprintln!("SKIPPED: the server needs root");
        return;
    }
    let spill = run.0.join("spill");
    let spill_arg = format!("--spill={}", spill.display());
    let too_big =
        tiermem_sim(&run.0, &["swap", "on", "--size", "64GiB", "--spill-size", "16MiB", &spill_arg, "--no-loop"]);
    assert!(!too_big.status.success());
    assert!(text(&too_big).contains("cannot fit"), "{}", text(&too_big));
    assert!(run.state().is_none() && !run.mounted() && !spill.exists(), "nothing left: {}", text(&too_big));

    std::fs::write(&spill, b"someone's file").unwrap();
    let taken = tiermem_sim(&run.0, &["swap", "on", "--size", "64MiB", &spill_arg, "--no-loop"]);
    assert!(!taken.status.success());
    assert!(text(&taken).contains("exists already"), "{}", text(&taken));
    assert_eq!(std::fs::read(&spill).unwrap(), b"someone's file", "left alone");
    std::fs::remove_file(&spill).unwrap();

    let on = tiermem_sim(&run.0, &["swap", "on", "--size", "64MiB", &spill_arg, "--no-loop", "--threads", "2"]);
    if !on.status.success() {
        let why = text(&on);
        assert!(why.contains("mounting the FUSE server"), "swap on failed for another reason: {why}");
        eprintln!("SKIPPED: this machine does not let the server mount FUSE: {why}");
        return;
    }
    assert!(text(&on).contains("the simulated device"), "{}", text(&on));
    assert!(spill.exists());
    let files: Vec<PathBuf> = String::from_utf8_lossy(&on.stdout).lines().map(PathBuf::from).collect();
    let data: Vec<u8> = (0..24 << 20).map(|i: u32| (i.wrapping_mul(2654435761) >> 11) as u8).collect();
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&files[0]).unwrap();
    file.write_all_at(&data, 4096).unwrap();
    let cap = tiermem_sim(&run.0, &["swap", "cap", "0", "--json"]);
    assert!(cap.status.success(), "{}", text(&cap));
    let reply: Value = serde_json::from_slice(&cap.stdout).unwrap();
    assert!(reply["seconds"].as_f64().is_some() && reply["hbm_bytes"].as_u64().is_some(), "{reply}");
    let mut back = vec![0u8; data.len()];
    file.read_exact_at(&mut back, 4096).unwrap();
    assert!(back == data, "the data after the give-back");
    drop(file);
    let s: Value = serde_json::from_slice(&tiermem_sim(&run.0, &["swap", "status", "--json"]).stdout).unwrap();
    assert_eq!(s["store"]["cap_bytes"], 0);
    assert!(s["store"]["present_bytes"].as_u64().unwrap() >= 24 << 20, "{s}");
    assert!(s["store"]["detail"]["areas_live"].as_u64().unwrap() > 0, "{s}");

    let pid = server_pid(&run);
    // SAFETY: kill takes integers only; the pid is the server this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(spill.exists(), "a dead engine leaves its spill file");
    let off = tiermem_sim(&run.0, &["swap", "off"]);
    assert!(off.status.success(), "{}", text(&off));
    assert!(!spill.exists(), "off removes it: {}", text(&off));
    assert!(!run.mounted() && run.state().is_none());
}
