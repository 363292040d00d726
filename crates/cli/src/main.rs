//! `tiermem`: probe the machine, run the demo, run the benchmarks, run the node daemon.

mod bench;
mod demo;
mod info;
mod node;
mod soak;
mod swap;
mod tenant_demo;
mod top;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "tiermem", version, about = "Tiered GPU memory: buffers larger than HBM at stable device addresses")]
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
    /// `status`, refreshed live in the terminal (q quits).
    Top(top::TopArgs),
    /// A swap device in idle VRAM, spilling to a file (docs/swap.md): on, off, status.
    Swap {
        #[command(subcommand)]
        command: swap::SwapCommand,
    },
    /// A tenant of the daemon with a verified working set (for tests and trying tiermemd).
    #[command(hide = true)]
    TenantDemo(tenant_demo::TenantDemoArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // A bug must end in a clear message and an exit code, not an unwinding crash.
    let outcome = std::panic::catch_unwind(|| match cli.command {
        Command::Info => info::run(),
        Command::Demo(args) => demo::run(args),
        Command::Soak(args) => soak::run(args),
        Command::Bench { suite } => bench::run(suite),
        Command::Daemon(args) => node::daemon(args),
        Command::Status(args) => node::status(args),
        Command::Top(args) => top::run(args),
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
