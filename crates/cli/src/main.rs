//! `tiermem`: probe the machine, run the demo, run the benchmarks.

mod bench;
mod demo;
mod info;
mod pattern;

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
    /// moves, verify every byte, print throughput and statistics.
    Demo(demo::DemoArgs),
    /// Run a benchmark suite and write its JSON report.
    Bench {
        #[command(subcommand)]
        suite: bench::Suite,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Info => info::run(),
        Command::Demo(args) => demo::run(args),
        Command::Bench { suite } => bench::run(suite),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("tiermem: {message}");
            ExitCode::FAILURE
        }
    }
}
