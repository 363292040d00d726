//! `tiermem swap on|off|status|limits|cap`: a swap device whose pages live in idle VRAM
//! (docs/swap.md). `on` starts the server (`tiermem swap serve`, hidden) detached and waits
//! until its devices are swap; the others talk to it on its control socket.
//!
//! ```text
//!  mod.rs      the subcommands, and what they share
//!  args.rs     their arguments; the device's settings, handed on to the server
//!  on.rs       on: start the server detached, wait until it is ready; serve: the server
//!  off.rs      off: stop the server, or clean up after one that died
//!  status.rs   status: the server's report, as text or JSON
//!  limits.rs   limits and cap: change the limits, force a cap on HBM
//! ```

mod args;
mod limits;
mod off;
mod on;
mod status;

use args::{CapArgs, LimitsArgs, OffArgs, OnArgs, ServeArgs, SwapStatusArgs};

use std::path::PathBuf;
use tiermem::format_size;
use tiermem_swap::control::RunDir;

#[derive(clap::Subcommand)]
pub enum SwapCommand {
    /// Start a swap device in idle VRAM (spilling to a file): serves it detached, waits until
    /// it is swap, prints its loop devices (one a line, on stdout).
    On(OnArgs),
    /// Stop it: swapoff (every page is read back into RAM first; progress on stderr), detach
    /// the loop devices, unmount, end the server. Cleans up after a server that died too.
    Off(OffArgs),
    /// What the server says: devices, bytes present, in HBM and in the file tier, limits,
    /// give-backs, requests; and the devices' lines of /proc/swaps.
    Status(SwapStatusArgs),
    /// Change the limits, in free VRAM (soft: take no more while less is free; hard: give VRAM
    /// back, moving pages to the spill file, while less is free).
    Limits(LimitsArgs),
    /// Force the device's HBM down to SIZE (give-back, as when GPU work claims the memory) and
    /// say how long it took; `none` lifts the cap.
    Cap(CapArgs),
    /// The server itself (started by `swap on`).
    #[command(hide = true)]
    Serve(ServeArgs),
}

pub fn run(command: SwapCommand) -> Result<(), String> {
    match command {
        SwapCommand::On(args) => on::on(args),
        SwapCommand::Off(args) => off::off(args),
        SwapCommand::Status(args) => status::status(args),
        SwapCommand::Limits(args) => limits::limits(args),
        SwapCommand::Cap(args) => limits::cap(args),
        SwapCommand::Serve(args) => on::serve(args),
    }
}

fn need_root(what: &str) -> Result<(), String> {
    // SAFETY: geteuid cannot fail and touches no memory of ours.
    if unsafe { libc::geteuid() } != 0 {
        return Err(format!("tiermem swap {what} needs root (mount, losetup, swapon and the control socket)"));
    }
    Ok(())
}

/// The server's socket, or why there is none to talk to.
fn running_server(run: &RunDir) -> Result<PathBuf, String> {
    if run.server_running() {
        return Ok(run.socket());
    }
    match run.read_state() {
        Some(state) => Err(format!(
            "the server (pid {}) died and left its devices behind: run `tiermem swap off` to clean up",
            state.pid
        )),
        None => Err("swap is off (`tiermem swap on --size SIZE` starts it)".into()),
    }
}

fn size(bytes: u64) -> String {
    format_size(bytes as usize)
}

fn optional(bytes: Option<u64>) -> String {
    bytes.map_or("none".into(), size)
}
