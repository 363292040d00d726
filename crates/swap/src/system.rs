//! The system around the server: locking its memory, its cgroup and OOM score, mounts, loop
//! devices (`losetup`), swap areas (`mkswap`, `swapon`, `swapoff`) and `/proc/swaps`.
//!
//! The commands are the util-linux ones the GPU machines have; their error output is passed on
//! in the errors. Nothing here runs on the I/O path.

use serde::{Deserialize, Serialize};
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `mlockall(MCL_CURRENT | MCL_FUTURE)`: the server's pages must never be reclaimed, since
/// reclaim may be waiting for the server to store the pages it swaps out.
pub fn lock_memory() -> io::Result<()> {
    // SAFETY: mlockall takes flags only.
    if unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `prctl(PR_SET_IO_FLUSHER)`: the kernel then lets this process allocate as if it were
/// doing the I/O of reclaim (it is). Needs `CAP_SYS_RESOURCE`, which root lacks on the GPU
/// machines (`EPERM`).
pub fn set_io_flusher() -> io::Result<()> {
    const PR_SET_IO_FLUSHER: libc::c_int = 57;
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(PR_SET_IO_FLUSHER, 1 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong, 0) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Makes this process the OOM killer's last choice (`oom_score_adj` -1000): killing the
/// server would take every page swapped to it with it.
pub fn protect_from_oom() -> io::Result<()> {
    std::fs::write("/proc/self/oom_score_adj", "-1000")
}

/// The current process's cgroup (v2), e.g. `/user.slice/session-1.scope`.
pub fn own_cgroup() -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|line| line.strip_prefix("0::")).map(str::to_string)
}

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The cgroups from `cgroup` up to the root that limit memory (`memory.max` or `memory.high`
/// other than `max`), with the limit.
pub fn memory_limits_on_path(cgroup: &str) -> Vec<(String, String)> {
    let mut limits = Vec::new();
    let mut path = cgroup.trim_end_matches('/').to_string();
    loop {
        for knob in ["memory.max", "memory.high"] {
            let file = format!("{CGROUP_ROOT}{path}/{knob}");
            if let Ok(value) = std::fs::read_to_string(&file) {
                if value.trim() != "max" {
                    limits.push((
                        format!("{}{knob}", if path.is_empty() { "/".into() } else { format!("{path}/") }),
                        value.trim().into(),
                    ));
                }
            }
        }
        match path.rfind('/') {
            Some(i) => path.truncate(i),
            None => break,
        }
    }
    limits
}

/// A cgroup v1 memory controller's limit on this process (hybrid hierarchies), where one is
/// set: this process cannot leave it by itself, and says so.
pub fn cgroup_v1_memory_limit() -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = text.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        controllers.split(',').any(|c| c == "memory").then(|| path.to_string())
    })?;
    let limit = std::fs::read_to_string(format!("{CGROUP_ROOT}/memory{path}/memory.limit_in_bytes")).ok()?;
    let limit: u64 = limit.trim().parse().ok()?;
    // "No limit" is the largest page-aligned i64.
    (limit < 1 << 62).then(|| format!("cgroup v1 memory controller {path}: limit {limit} bytes"))
}

/// Moves this process out of any cgroup that limits memory, into `/sys/fs/cgroup/tiermem-swap`
/// (created; no limits, `memory.min` where the controller exists). A swap server that a
/// memory limit can push into reclaim would wait on itself. Returns where the process is.
pub fn leave_memory_limited_cgroup() -> Result<String, String> {
    let current = own_cgroup().ok_or("no cgroup v2 membership in /proc/self/cgroup")?;
    let limits = memory_limits_on_path(&current);
    if limits.is_empty() {
        return match cgroup_v1_memory_limit() {
            Some(v1) => Err(format!("in {current}, but under a {v1}")),
            None => Ok(current),
        };
    }
    let ours = Path::new(CGROUP_ROOT).join("tiermem-swap");
    let moved = std::fs::create_dir_all(&ours)
        .and_then(|()| std::fs::write(ours.join("cgroup.procs"), std::process::id().to_string()));
    if let Err(e) = moved {
        let limits: Vec<String> = limits.iter().map(|(k, v)| format!("{k}={v}")).collect();
        return Err(format!("stayed in {current} ({}): could not move to {}: {e}", limits.join(", "), ours.display()));
    }
    let now = own_cgroup().unwrap_or_default();
    let left = memory_limits_on_path(&now);
    if left.is_empty() {
        Ok(now)
    } else {
        let left: Vec<String> = left.iter().map(|(k, v)| format!("{k}={v}")).collect();
        Err(format!("moved to {now}, still under memory limits: {}", left.join(", ")))
    }
}

/// The memory of this process locked in RAM (`Locked` in `/proc/self/smaps_rollup`: resident
/// and locked; `VmLck` would also count reserved address space never touched), in bytes.
pub fn locked_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/smaps_rollup").ok()?;
    let line = status.lines().find(|l| l.starts_with("Locked:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
}

/// `umount2(path)`, lazily (`MNT_DETACH`) where asked.
pub fn unmount(path: &Path, lazy: bool) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: c is a valid NUL-terminated path that outlives the call.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether `path` is a mount point (in `/proc/self/mountinfo`), and of which type.
pub fn mount_type(path: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let wanted = path.to_string_lossy();
    info.lines().rev().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let mount_point = unescape_mount(fields.get(4)?);
        let dash = fields.iter().position(|f| *f == "-")?;
        (mount_point == wanted).then(|| fields.get(dash + 1).map(|s| s.to_string())).flatten()
    })
}

/// `/proc/*/mountinfo` and `/proc/swaps` escape blanks and backslashes as `\ooo`.
fn unescape_mount(field: &str) -> String {
    let mut out = Vec::new();
    let bytes = field.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() && bytes[i + 1..i + 4].iter().all(|b| (b'0'..=b'7').contains(b)) {
            out.push(u8::from_str_radix(std::str::from_utf8(&bytes[i + 1..i + 4]).unwrap_or("0"), 8).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The file system type's magic number of the file system holding `path` (`statfs`).
pub fn fs_magic(path: &Path) -> io::Result<i64> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: zeroed statfs is a valid out-parameter; c is NUL-terminated and outlives the call.
    let mut buf: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statfs(c.as_ptr(), &mut buf) } == 0 {
        Ok(buf.f_type as i64)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Refuses a spill file in memory-backed file systems (tmpfs, ramfs): pages there can be
/// swapped to the device they are spilled from, which deadlocks the kernel (issue 14).
pub fn check_spill_location(file: &Path) -> Result<(), String> {
    const TMPFS: i64 = 0x0102_1994;
    const RAMFS: i64 = 0x8584_58f6;
    const FUSE: i64 = 0x6573_5546;
    let dir = file.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let magic = fs_magic(dir).map_err(|e| format!("spill file {}: {}: {e}", file.display(), dir.display()))?;
    let what = match magic {
        TMPFS => "tmpfs",
        RAMFS => "ramfs",
        FUSE => "a FUSE file system",
        _ => return Ok(()),
    };
    Err(format!(
        "spill file {}: {} is on {what}; its pages could be swapped to the device they spill from, which \
         deadlocks the kernel. Put it on a disk (--spill FILE)",
        file.display(),
        dir.display()
    ))
}

/// Runs a command; its stdout on success, else an error with its stderr.
pub fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let output = Command::new(program)
        .args(args)
        .env("LC_ALL", "C")
        .output()
        .map_err(|e| format!("{program} {}: {e}", args.join(" ")))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        Err(format!("{program} {}: {} ({})", args.join(" "), stderr.trim(), output.status))
    }
}

/// `/sys/block/loopN/...` for `/dev/loopN`.
fn loop_sys(device: &str, file: &str) -> PathBuf {
    let name = device.rsplit('/').next().unwrap_or(device);
    Path::new("/sys/block").join(name).join(file)
}

/// Attaches `file` to a free loop device with direct I/O (`losetup --direct-io=on --show -f`)
/// and checks that direct I/O is on: without it every page swapped out would stay in the page
/// cache. Returns `/dev/loopN`.
pub fn attach_loop(file: &Path) -> Result<String, String> {
    let file = file.to_string_lossy();
    let device = run("losetup", &["--direct-io=on", "--show", "-f", &file])?.trim().to_string();
    if !device.starts_with("/dev/loop") {
        return Err(format!("losetup --show printed {device:?}, not a loop device"));
    }
    let dio = std::fs::read_to_string(loop_sys(&device, "loop/dio")).unwrap_or_default();
    if dio.trim() != "1" {
        let _ = detach_loop(&device);
        return Err(format!(
            "{device} over {file}: the kernel did not turn direct I/O on (loop/dio={:?}); swapped pages would \
             stay in the page cache",
            dio.trim()
        ));
    }
    // The loop device's queue adds nothing but latency in front of the server's own.
    let _ = std::fs::write(loop_sys(&device, "queue/scheduler"), "none");
    Ok(device)
}

/// `losetup -d`.
pub fn detach_loop(device: &str) -> Result<(), String> {
    run("losetup", &["-d", device]).map(|_| ())
}

/// The loop devices whose backing file is under `dir`, with that file (`/sys/block/loop*/loop/
/// backing_file`): how leftovers are found even where the state file missed them.
pub fn loops_backed_under(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/sys/block") else { return found };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        let Ok(backing) = std::fs::read_to_string(entry.path().join("loop/backing_file")) else { continue };
        // A backing file gone from its file system shows " (deleted)".
        let backing = PathBuf::from(backing.trim().trim_end_matches(" (deleted)"));
        if backing.starts_with(dir) {
            found.push((format!("/dev/{name}"), backing));
        }
    }
    found.sort();
    found
}

/// `mkswap` on a device, labelled.
pub fn make_swap(device: &str, label: &str) -> Result<(), String> {
    run("mkswap", &["-L", label, device]).map(|_| ())
}

/// `swapon -p PRIORITY --discard=pages`: discards of freed swap pages reach the store (and
/// give its memory back).
pub fn swap_on(device: &str, priority: i32) -> Result<(), String> {
    run("swapon", &["-p", &priority.to_string(), "--discard=pages", device]).map(|_| ())
}

/// `swapoff`: the kernel reads every page back into RAM first; this can take long, and fails
/// (the area stays on) where RAM cannot hold them.
pub fn swap_off(device: &str) -> Result<(), String> {
    run("swapoff", &[device]).map(|_| ())
}

/// One line of `/proc/swaps`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwapArea {
    pub filename: String,
    pub kind: String,
    pub size_bytes: u64,
    pub used_bytes: u64,
    pub priority: i32,
}

/// Parses `/proc/swaps` (`Filename Type Size Used Priority`, sizes in KiB).
pub fn parse_proc_swaps(text: &str) -> Vec<SwapArea> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 5 {
                return None;
            }
            Some(SwapArea {
                filename: unescape_mount(f[0]),
                kind: f[1].to_string(),
                size_bytes: f[2].parse::<u64>().ok()? * 1024,
                used_bytes: f[3].parse::<u64>().ok()? * 1024,
                priority: f[4].parse().ok()?,
            })
        })
        .collect()
}

/// The swap areas now on.
pub fn swap_areas() -> Vec<SwapArea> {
    std::fs::read_to_string("/proc/swaps").map(|t| parse_proc_swaps(&t)).unwrap_or_default()
}

/// `/proc/swaps` names a loop device as `/dev/loopN`.
pub fn swap_area(device: &str) -> Option<SwapArea> {
    swap_areas().into_iter().find(|a| a.filename == device)
}

/// The block-device back-ends this machine offers a VRAM swap device, fastest first, each with
/// whether it is usable and why: ublk (`/dev/ublk-control`), NBD (the `nbd` module) and a FUSE
/// file behind a loop device (`/dev/fuse`, `/dev/loop-control`). `tiermem swap on` serves
/// FUSE + loop, the one every kernel here has; the others are not built yet.
pub fn swap_backends() -> Vec<(&'static str, bool, String)> {
    let exists = |path: &str| Path::new(path).exists();
    let nbd = exists("/sys/module/nbd") || exists("/dev/nbd0");
    let (fuse, loops) = (exists("/dev/fuse"), exists("/dev/loop-control"));
    vec![
        (
            "ublk",
            false,
            format!(
                "/dev/ublk-control {}; not built yet",
                if exists("/dev/ublk-control") { "present" } else { "absent" }
            ),
        ),
        ("nbd", false, format!("nbd module {}; not built yet", if nbd { "loaded" } else { "absent" })),
        (
            "fuse+loop",
            fuse && loops,
            format!(
                "/dev/fuse {}, /dev/loop-control {}",
                if fuse { "present" } else { "absent" },
                if loops { "present" } else { "absent" }
            ),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_swaps_parses() {
        let text = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n\
                    /dev/loop3                              partition\t2097148\t\t1024\t\t100\n\
                    /swap\\040file                           file\t\t1048572\t\t0\t\t-2\n";
        let areas = parse_proc_swaps(text);
        assert_eq!(areas.len(), 2);
        assert_eq!(
            areas[0],
            SwapArea {
                filename: "/dev/loop3".into(),
                kind: "partition".into(),
                size_bytes: 2097148 * 1024,
                used_bytes: 1024 * 1024,
                priority: 100
            }
        );
        assert_eq!(areas[1].filename, "/swap file");
        assert_eq!(areas[1].priority, -2);
        assert!(parse_proc_swaps("Filename Type Size Used Priority\n").is_empty());
    }

    #[test]
    fn mount_points_are_found() {
        assert_eq!(mount_type(Path::new("/proc")).as_deref(), Some("proc"));
        assert_eq!(mount_type(Path::new("/proc/self")), None);
    }

    #[test]
    fn spill_on_tmpfs_is_refused() {
        if fs_magic(Path::new("/dev/shm")).ok() == Some(0x0102_1994) {
            let err = check_spill_location(Path::new("/dev/shm/spill")).unwrap_err();
            assert!(err.contains("tmpfs"), "{err}");
        }
        assert!(check_spill_location(Path::new("/nonexistent-dir/spill")).is_err());
    }
}
