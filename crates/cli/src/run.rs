//! `tiermem run [--hbm-limit SIZE] [--peers auto|LIST] [--stats] [--label NAME | --no-daemon] -- CMD ARGS…`: runs an
//! unmodified CUDA program with `libtiermem_preload.so` preloaded (docs/transparent.md), so that
//! its device allocations beyond the budget land in host memory (or, with `--peers`, in neighbour
//! GPUs' spare HBM first) instead of failing. With the node
//! daemon running, the budget is the daemon's grant, at most `--hbm-limit` (`TIERMEM_DAEMON`).
//!
//! The library is found next to the `tiermem` executable (where `cargo build --release` and
//! `cargo install` put both), or at `TIERMEM_PRELOAD`. It goes first in `LD_PRELOAD`, before
//! whatever the caller preloads already; the budget and `--stats` travel as `TIERMEM_HBM_LIMIT`
//! (bytes) and `TIERMEM_STATS`. Then tiermem execs the command, so the command's exit status
//! (or signal) is tiermem's, and its children inherit the environment, hence the preload too.

use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

/// The preload library's file name.
const LIBRARY: &str = "libtiermem_preload.so";

#[derive(clap::Args)]
pub struct RunArgs {
    /// HBM the program's allocations may take on each GPU (e.g. 20GiB); beyond it they are
    /// mapped in host memory. Default: the GPU's free memory when the program starts, less 2 GiB.
    /// With the node daemon running (`tiermem daemon`), the budget is its grant, at most this.
    #[arg(long, value_name = "SIZE")]
    hbm_limit: Option<String>,
    /// Neighbour GPUs whose spare HBM holds what is beyond the budget before host memory:
    /// `auto` (those this GPU reaches over NVLink or PCIe peer access, with no other process on
    /// them) or ordinals like `1,2` (`TIERMEM_PEERS`; each keeps `TIERMEM_PEER_RESERVE` free,
    /// 4 GiB by default). Off unless asked: memory lent to the program returns only as the
    /// program frees it or tiermem moves it back up.
    #[arg(long, value_name = "auto|LIST")]
    peers: Option<String>,
    /// The name the node daemon's configuration knows this program by (`TIERMEM_LABEL`).
    #[arg(long, value_name = "NAME", conflicts_with = "no_daemon")]
    label: Option<String>,
    /// Keep to --hbm-limit even where the node daemon runs (`TIERMEM_DAEMON=off`).
    #[arg(long)]
    no_daemon: bool,
    /// At exit, print what the program allocated where (HBM, host, peaks) on stderr.
    #[arg(long)]
    stats: bool,
    /// The program to run and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
    command: Vec<OsString>,
}

/// Finds the library: `TIERMEM_PRELOAD`, else next to the `tiermem` executable.
pub(crate) fn preload_library() -> Result<PathBuf, String> {
    let path = match std::env::var_os("TIERMEM_PRELOAD") {
        Some(path) => PathBuf::from(path),
        None => {
            let exe = crate::native_program("tiermem run")
                .map_err(|e| format!("{e}; or set TIERMEM_PRELOAD to libtiermem_preload.so's path"))?;
            exe.parent().map(|dir| dir.join(LIBRARY)).ok_or_else(|| format!("{} has no folder", exe.display()))?
        }
    };
    if !path.is_file() {
        return Err(format!(
            "run: {} not found; build it with `cargo build --release -p tiermem-preload` (it lands next to \
             the tiermem executable), or set TIERMEM_PRELOAD to its path",
            path.display()
        ));
    }
    // LD_PRELOAD wants a path the program finds from wherever it changes directory to.
    path.canonicalize().map_err(|e| format!("run: {}: {e}", path.display()))
}

/// `LD_PRELOAD` with `library` first, the caller's entries after it (once).
fn preload_with(library: &OsStr, existing: Option<&OsStr>) -> OsString {
    let mut value = library.to_owned();
    let existing = existing.map(|e| e.to_string_lossy().into_owned()).unwrap_or_default();
    for entry in existing.split([':', ' ']).filter(|e| !e.is_empty() && OsStr::new(e) != library) {
        value.push(":");
        value.push(entry);
    }
    value
}

/// Makes `command` run under tiermem: the library preloaded, the budget (bytes) if given.
pub(crate) fn interpose(command: &mut Command, hbm_limit: Option<usize>) -> Result<(), String> {
    let library = preload_library()?;
    command.env("LD_PRELOAD", preload_with(library.as_os_str(), std::env::var_os("LD_PRELOAD").as_deref()));
    if let Some(bytes) = hbm_limit {
        command.env("TIERMEM_HBM_LIMIT", bytes.to_string());
    }
    Ok(())
}

/// Execs the command; returns only if it could not be started.
pub fn run(args: RunArgs) -> Result<(), String> {
    let (program, rest) = args.command.split_first().ok_or("run: no command given (tiermem run -- CMD ARGS…)")?;
    let mut command = Command::new(program);
    command.args(rest);
    let limit = args.hbm_limit.as_deref().map(tiermem::parse_size).transpose();
    interpose(&mut command, limit.map_err(|e| format!("run: --hbm-limit: {e}"))?)?;
    if args.stats {
        command.env("TIERMEM_STATS", "1");
    }
    if let Some(peers) = &args.peers {
        peers
            .parse::<tiermem::PeerChoice>()
            .map_err(|e| format!("run: --peers: {e} (auto, off, or GPU ordinals like 1,2)"))?;
        command.env("TIERMEM_PEERS", peers);
    }
    if let Some(label) = &args.label {
        command.env("TIERMEM_LABEL", label);
    }
    if args.no_daemon {
        command.env("TIERMEM_DAEMON", "off");
    }
    let failed = command.exec();
    Err(format!("run: starting {}: {failed}", program.to_string_lossy()))
}

#[cfg(test)]
mod tests {
    use super::preload_with;
    use std::ffi::OsStr;

    #[test]
    fn the_library_goes_first_and_only_once() {
        let lib = OsStr::new("/opt/tiermem/libtiermem_preload.so");
        assert_eq!(preload_with(lib, None), lib);
        assert_eq!(
            preload_with(lib, Some(OsStr::new("libfoo.so bar.so"))),
            "/opt/tiermem/libtiermem_preload.so:libfoo.so:bar.so"
        );
        let again = preload_with(lib, Some(OsStr::new("/opt/tiermem/libtiermem_preload.so:libfoo.so")));
        assert_eq!(again, "/opt/tiermem/libtiermem_preload.so:libfoo.so");
    }
}
