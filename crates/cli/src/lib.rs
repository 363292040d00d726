//! `tiermem`: probe the machine, run the demo, run the benchmarks, run the node daemon, run an
//! unmodified CUDA program over tiermem.
//!
//! The program is this library, so that it runs two ways: as the `tiermem` executable
//! (main.rs), and inside the Python package (`pip install tiermem` puts a `tiermem` command on
//! the path that runs [`run_embedded`] through the extension module). Helper processes it starts
//! (the daemon of `bench tenants`, its workers, the server of `swap on`) start the same
//! program again, [`own_program`], whichever way it runs.

mod bench;
mod demo;
mod info;
mod lend;
mod node;
mod run;
mod soak;
mod swap;
mod tenant_demo;
mod top;

use clap::{Parser, Subcommand};
use std::ffi::OsString;
use std::process::{Command as Process, ExitCode};
use std::sync::OnceLock;

/// How this program starts itself again when it runs embedded (`run_embedded`).
static OWN_PROGRAM: OnceLock<Vec<OsString>> = OnceLock::new();

/// A command that starts this program again: the running executable, or what
/// [`run_embedded`] was told (e.g. `python3 -m tiermem`).
pub(crate) fn own_program() -> Result<Process, String> {
    match OWN_PROGRAM.get().and_then(|argv| argv.split_first()) {
        Some((program, args)) => {
            let mut command = Process::new(program);
            command.args(args);
            Ok(command)
        }
        None => std::env::current_exe().map(Process::new).map_err(|e| format!("finding the tiermem program: {e}")),
    }
}

/// The `tiermem` executable itself, for what needs its path; refused when embedded.
pub(crate) fn native_program(call: &str) -> Result<std::path::PathBuf, String> {
    if OWN_PROGRAM.get().is_some() {
        return Err(format!(
            "{call} needs the tiermem executable itself (cargo install --path crates/cli), not the Python package's command"
        ));
    }
    std::env::current_exe().map_err(|e| format!("finding the tiermem program: {e}"))
}

/// Runs the program inside another process (the Python package): `own_program` is how to start
/// it again, `args` its command line (the program's name first). Returns the exit status.
pub fn run_embedded(own_program: Vec<OsString>, args: Vec<OsString>) -> i32 {
    let _ = OWN_PROGRAM.set(own_program);
    match main(args) {
        code if code == ExitCode::SUCCESS => 0,
        _ => 1,
    }
}

/// `tiermem --version`: the package's version and the commit it was built from (build.rs).
const VERSION: &str = match env!("TIERMEM_BUILT_FROM").is_empty() {
    true => env!("CARGO_PKG_VERSION"),
    false => concat!(env!("CARGO_PKG_VERSION"), " (", env!("TIERMEM_BUILT_FROM"), ")"),
};

#[derive(Parser)]
#[command(name = "tiermem", version = VERSION, about = "Tiered GPU memory: buffers larger than HBM at stable device addresses")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Probe the driver, the GPUs and the limits tiermem depends on.
    Info,
    /// Allocate twice the HBM cap, write known patterns, cycle acquire/release so data
    /// moves, time the steady rounds beside the link's ceiling, verify every byte.
    Demo(demo::DemoArgs),
    /// Random operations on several threads across every tier, every byte verified by GPU
    /// kernels and host reads; a non-zero exit on any mismatch, unexpected error or leak.
    Soak(soak::SoakArgs),
    /// Run a benchmark suite and write its JSON report.
    Bench {
        #[command(subcommand)]
        suite: bench::Suite,
    },
    /// Run the node daemon tiermemd in the foreground (logs on stderr): it shares each GPU's
    /// HBM among the processes using tiermem (docs/daemon.md).
    Daemon(node::DaemonArgs),
    /// What the node daemon says of each GPU, tier and tenant: used, budget, lent.
    Status(node::StatusArgs),
    /// Lend a GPU's spare HBM to tiermem tenants on the node's other GPUs, through the daemon
    /// (slabs passed to them as file descriptors; docs/daemon.md).
    Lend(lend::LendArgs),
    /// `status`, refreshed live in the terminal (q quits).
    Top(top::TopArgs),
    /// Run an unmodified CUDA program with tiermem under it: allocations beyond --hbm-limit
    /// (or the node daemon's grant) are mapped in host memory instead of failing
    /// (docs/transparent.md).
    Run(run::RunArgs),
    /// A swap device in idle VRAM, spilling to a file (docs/swap.md): on, off, status.
    Swap {
        #[command(subcommand)]
        command: swap::SwapCommand,
    },
    /// A tenant of the daemon with a verified working set (for tests and trying tiermemd).
    #[command(hide = true)]
    TenantDemo(tenant_demo::TenantDemoArgs),
}

/// Runs the program on the command line `args` (the program's name first).
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let cli = Cli::parse_from(args);
    // A bug must end in a clear message and an exit code, not an unwinding crash.
    let outcome = std::panic::catch_unwind(|| match cli.command {
        Command::Info => info::run(),
        Command::Demo(args) => demo::run(args),
        Command::Soak(args) => soak::run(args),
        Command::Bench { suite } => bench::run(suite),
        Command::Daemon(args) => node::daemon(args),
        Command::Status(args) => node::status(args),
        Command::Lend(args) => lend::run(args),
        Command::Top(args) => top::run(args),
        Command::Run(args) => run::run(args),
        Command::Swap { command } => swap::run(command),
        Command::TenantDemo(args) => tenant_demo::run(args),
    })
    .unwrap_or_else(|panic| {
        let what =
            panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned());
        Err(format!("internal error (a bug in tiermem, please report it): {}", what.unwrap_or_default()))
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("tiermem: {message}");
            ExitCode::FAILURE
        }
    }
}
