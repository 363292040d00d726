//! `tiermem run [--hbm-limit SIZE] [--policy auto|hotness|placement] [--peers auto|LIST] [--torch-allocator] [--stats] [--keep-allocators] [--label NAME | --no-daemon] -- CMD ARGS…`: runs an
//! unmodified CUDA program with `libtiermem_preload.so` preloaded (docs/transparent.md), so that
//! its device allocations beyond the budget land in host memory (or, with `--peers`, in neighbour
//! GPUs' spare HBM first) instead of failing. With the node
//! daemon running, the budget is the daemon's grant, at most `--hbm-limit` (`TIERMEM_DAEMON`).
//!
//! The library is found next to the `tiermem` executable (where `cargo build --release` and
//! `cargo install` put both), or at `TIERMEM_PRELOAD`. It goes first in `LD_PRELOAD`, before
//! whatever the caller preloads already; the budget and `--stats` travel as `TIERMEM_HBM_LIMIT`
//! (bytes) and `TIERMEM_STATS`. `--torch-allocator` also puts a `sitecustomize` hook
//! (torch_hook.py) first on PYTHONPATH, which makes tiermem's `CUDAPluggableAllocator`
//! PyTorch's allocator once `torch` is imported. Then tiermem execs the command, so the command's exit status
//! (or signal) is tiermem's, and its children inherit the environment, hence the preload too.
//! JAX and TensorFlow are pointed at the GPU's default memory pool, tiermem's, unless the
//! environment chose their allocators (`POOL_ALLOCATORS`), and PyTorch's `expandable_segments`
//! is turned off where the environment turns it on ([`without_expandable_segments`]); both
//! unless `--keep-allocators`.

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use tiermem::HbmLimit;

/// The preload library's file name.
const LIBRARY: &str = "libtiermem_preload.so";

#[derive(clap::Args)]
pub struct RunArgs {
    /// HBM the program's allocations may take on each GPU: a size (e.g. 20GiB) or a share of
    /// each GPU's memory (e.g. 50%); beyond it they are mapped in host memory. Default: the
    /// GPU's free memory when the program starts, less 2 GiB (also taken, and said, for a size
    /// beyond the GPU's memory). With the node daemon running (`tiermem daemon`), the budget
    /// is its grant, at most this.
    #[arg(long, value_name = "SIZE|N%")]
    hbm_limit: Option<String>,
    /// What moves chunks between HBM and the host once the program's memory exceeds the budget:
    /// `auto` (the default: the hottest chunks by launch arguments promoted at the program's
    /// synchronizations, and the cycles of a program that repeats its steps learned and paged
    /// ahead: training loops), `hotness` (by launch arguments alone, no cycles learned,
    /// `TIERMEM_SEGMENTS=off`: decoding, where each token reads every weight once) or
    /// `placement` (nothing moves and tiermem never pauses the program: what allocation put in
    /// HBM stays there and the rest is read in place over the link, `TIERMEM_MIGRATE=off`).
    #[arg(long, value_enum, value_name = "POLICY")]
    policy: Option<Policy>,
    /// Neighbour GPUs whose spare HBM holds what is beyond the budget before host memory:
    /// `auto` (those this GPU reaches over NVLink or PCIe peer access, with no other process on
    /// them) or ordinals like `1,2` (`TIERMEM_PEERS`; each keeps `TIERMEM_PEER_RESERVE` free,
    /// 4 GiB by default; a lender that runs short gets memory back at the program's next
    /// synchronization). Off unless asked: lent memory returns only at the program's pace.
    #[arg(long, value_name = "auto|LIST")]
    peers: Option<String>,
    /// PyTorch programs: make tiermem's `CUDAPluggableAllocator` PyTorch's allocator once
    /// `torch` is imported, so that every tensor is an allocation of tiermem's (a
    /// `sitecustomize` hook on PYTHONPATH; docs/transparent.md, "The PyTorch route").
    #[arg(long)]
    torch_allocator: bool,
    /// The name the node daemon's configuration knows this program by (`TIERMEM_LABEL`).
    #[arg(long, value_name = "NAME", conflicts_with = "no_daemon")]
    label: Option<String>,
    /// Keep to --hbm-limit even where the node daemon runs (`TIERMEM_DAEMON=off`).
    #[arg(long)]
    no_daemon: bool,
    /// At exit, print what the program allocated where (HBM, host, peaks) on stderr.
    #[arg(long)]
    stats: bool,
    /// Leave JAX's, TensorFlow's and PyTorch's allocator settings as they are. By default, where
    /// the program's environment does not choose them, tiermem sets
    /// `XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async` and `TF_GPU_ALLOCATOR=cuda_malloc_async`: their
    /// default allocators take their whole memory sized by the budget and can never exceed it,
    /// while the CUDA pool these select is tiermem's. Older JAX releases refuse `cuda_async`:
    /// run them with this flag. And it turns PyTorch's `expandable_segments:True` off (in
    /// `PYTORCH_CUDA_ALLOC_CONF` / `PYTORCH_ALLOC_CONF`): its memory is mapped by PyTorch itself,
    /// which tiermem counts but never moves, so what lands beyond the budget would stay in host
    /// memory.
    #[arg(long)]
    keep_allocators: bool,
    /// The program to run and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    command: Vec<OsString>,
}

/// `--policy`: which of the preload's stages run (docs/transparent.md, "How it works").
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Policy {
    /// Hotness at quiesce points, and cycles learned and paged ahead (stages 2 and 3).
    Auto,
    /// Hotness at quiesce points only (stage 2).
    Hotness,
    /// Nothing moves after allocation placed it (stage 1).
    Placement,
}

impl Policy {
    /// The preload's settings that select it.
    fn environment(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Policy::Auto => &[("TIERMEM_MIGRATE", "on"), ("TIERMEM_SEGMENTS", "on")],
            Policy::Hotness => &[("TIERMEM_MIGRATE", "on"), ("TIERMEM_SEGMENTS", "off")],
            Policy::Placement => &[("TIERMEM_MIGRATE", "off")],
        }
    }
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

/// Makes `command` run under tiermem: the library preloaded, the budget if given. The
/// library's path.
pub(crate) fn interpose_library(command: &mut Command, hbm_limit: Option<HbmLimit>) -> Result<PathBuf, String> {
    let library = preload_library()?;
    command.env("LD_PRELOAD", preload_with(library.as_os_str(), std::env::var_os("LD_PRELOAD").as_deref()));
    if let Some(limit) = hbm_limit {
        command.env("TIERMEM_HBM_LIMIT", limit.to_string());
    }
    Ok(library)
}

/// Puts the PyTorch hook (torch_hook.py, as `sitecustomize.py` in a folder of this user's)
/// first on the command's PYTHONPATH, naming `library` as the allocator's.
pub(crate) fn install_torch_hook(command: &mut Command, library: &std::path::Path) -> Result<(), String> {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let dir = std::env::temp_dir().join(format!("tiermem-{uid}-torch-hook"));
    let failed = |what: &str, e: std::io::Error| format!("run: --torch-allocator: {what} {}: {e}", dir.display());
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir).map_err(|e| failed("creating", e))?;
    // Python runs what lies there: a folder someone else owns, or may write into, is refused.
    let meta = std::fs::symlink_metadata(&dir).map_err(|e| failed("reading", e))?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(format!(
            "run: --torch-allocator: {} is not a folder of this user's that only it may write into; \
             remove it, or set TMPDIR to another folder",
            dir.display()
        ));
    }
    // Written whole under another name, then renamed: a program starting meanwhile reads the
    // old file or the new one, never half of one.
    let partial = dir.join(format!("sitecustomize.py.{}", std::process::id()));
    std::fs::write(&partial, include_str!("torch_hook.py")).map_err(|e| failed("writing into", e))?;
    std::fs::rename(&partial, dir.join("sitecustomize.py")).map_err(|e| failed("writing into", e))?;
    let mut path = dir.into_os_string();
    if let Some(rest) = std::env::var_os("PYTHONPATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(rest);
    }
    command.env("PYTHONPATH", path).env("TIERMEM_TORCH_ALLOCATOR", library);
    Ok(())
}

/// Frameworks whose default allocator takes all the memory it will ever use up front, sized by
/// `cuMemGetInfo` (under tiermem the budget), and fails beyond it: XLA's BFC allocator (JAX) and
/// TensorFlow's. Each variable selects the framework's allocator over the GPU's default memory
/// pool instead, which tiermem serves (`cuMemAllocFromPoolAsync`: docs/transparent.md, "Memory
/// pools"), so the program's memory can outgrow the budget. On the H200, JAX at half its peak
/// ran out of memory in its BFC allocator and ran to the plain run's bytes with `cuda_async`
/// (BENCHMARKS.md, thirty-sixth session).
const POOL_ALLOCATORS: [(&str, &str); 2] =
    [("XLA_PYTHON_CLIENT_ALLOCATOR", "cuda_async"), ("TF_GPU_ALLOCATOR", "cuda_malloc_async")];

/// The allocator settings of [`POOL_ALLOCATORS`] that the environment leaves to choose
/// (`chosen(name)`: whether the environment sets `name`).
fn pool_allocators_to_set(chosen: impl Fn(&str) -> bool) -> Vec<(&'static str, &'static str)> {
    POOL_ALLOCATORS.into_iter().filter(|(name, _)| !chosen(name)).collect()
}

/// PyTorch's allocator settings (the second name is the first's since PyTorch 2.9).
const TORCH_ALLOC_CONF: [&str; 2] = ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"];

/// A PyTorch allocator setting (`key:value,key:value`) with `expandable_segments:True` turned
/// off, if it turns it on; the other options as they were. With expandable segments PyTorch
/// maps the memory itself (`cuMemCreate`, `cuMemMap`): tiermem counts those chunks and makes
/// them on the host beyond the budget, but does not move the program's own chunks, so the
/// tensors that land there — a training step's last activations — would stay in host memory
/// (docs/transparent.md). Without them PyTorch's segments are `cudaMalloc`s, which move.
fn without_expandable_segments(conf: &str) -> Option<String> {
    let is_on = |option: &str| {
        let (key, value) = option.split_once(':').unwrap_or((option, ""));
        key.trim() == "expandable_segments" && value.trim().eq_ignore_ascii_case("true")
    };
    let options: Vec<&str> = conf.split(',').collect();
    options.iter().any(|o| is_on(o)).then(|| {
        let kept = options.iter().map(|&o| if is_on(o) { "expandable_segments:False" } else { o });
        kept.collect::<Vec<_>>().join(",")
    })
}

/// Execs the command; returns only if it could not be started.
pub fn run(args: RunArgs) -> Result<(), String> {
    let (program, rest) = args.command.split_first().ok_or("run: no command given (tiermem run -- CMD ARGS…)")?;
    let mut command = Command::new(program);
    command.args(rest);
    let limit = args.hbm_limit.as_deref().map(HbmLimit::parse).transpose();
    let library = interpose_library(&mut command, limit.map_err(|e| format!("run: --hbm-limit: {e}"))?)?;
    if args.torch_allocator {
        install_torch_hook(&mut command, &library)?;
    }
    if args.stats {
        command.env("TIERMEM_STATS", "1");
    }
    if let Some(policy) = args.policy {
        command.envs(policy.environment().iter().copied());
    }
    if !args.keep_allocators {
        command.envs(pool_allocators_to_set(|name| std::env::var_os(name).is_some()));
        // The PyTorch route's allocator is tiermem's: PyTorch's settings do not apply to it.
        for name in TORCH_ALLOC_CONF.into_iter().filter(|_| !args.torch_allocator) {
            let Some(off) = std::env::var(name).ok().as_deref().and_then(without_expandable_segments) else { continue };
            eprintln!(
                "tiermem: run: {name}: expandable_segments turned off: PyTorch would map that memory itself, \
                 which tiermem cannot move, so what lands beyond the budget would stay in host memory \
                 (--keep-allocators keeps it)"
            );
            command.env(name, off);
        }
    }
    if let Some(peers) = &args.peers {
        peers.parse::<tiermem::PeerChoice>().map_err(|e| format!("run: --peers: {e}"))?;
        command.env("TIERMEM_PEERS", peers);
    }
    if let Some(label) = &args.label {
        command.env("TIERMEM_LABEL", label);
    }
    if args.no_daemon {
        command.env("TIERMEM_DAEMON", "off");
    }
    // The command keeps this process's pid: the preload reports at exit for it, and for its
    // descendants only where they used the driver.
    command.env("TIERMEM_RUN_PID", std::process::id().to_string());
    let failed = command.exec();
    // Said as env(1) and timeout(1) say it, in the exit status too: 127 for a command not
    // found, 126 for one found that cannot run.
    eprintln!("tiermem: run: starting {}: {failed}", program.to_string_lossy());
    std::process::exit(if failed.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 })
}

#[cfg(test)]
mod tests {
    use super::{pool_allocators_to_set, preload_with, without_expandable_segments};
    use std::ffi::OsStr;

    #[test]
    fn frameworks_get_the_pool_allocator_unless_the_environment_chose_one() {
        let all = pool_allocators_to_set(|_| false);
        assert_eq!(all, [("XLA_PYTHON_CLIENT_ALLOCATOR", "cuda_async"), ("TF_GPU_ALLOCATOR", "cuda_malloc_async")]);
        let jax_chose = pool_allocators_to_set(|name| name == "XLA_PYTHON_CLIENT_ALLOCATOR");
        assert_eq!(jax_chose, [("TF_GPU_ALLOCATOR", "cuda_malloc_async")]);
        assert!(pool_allocators_to_set(|_| true).is_empty());
    }

    #[test]
    fn expandable_segments_are_turned_off_and_the_other_options_kept() {
        let on = "max_split_size_mb:128, expandable_segments:True,garbage_collection_threshold:0.8";
        assert_eq!(
            without_expandable_segments(on).as_deref(),
            Some("max_split_size_mb:128,expandable_segments:False,garbage_collection_threshold:0.8")
        );
        assert_eq!(
            without_expandable_segments("expandable_segments:true").as_deref(),
            Some("expandable_segments:False")
        );
        for left in ["expandable_segments:False", "backend:cudaMallocAsync", "", "max_split_size_mb:64"] {
            assert_eq!(without_expandable_segments(left), None, "{left}");
        }
    }

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
