//! `tiermem swap limits` and `tiermem swap cap`: change the server's limits in free VRAM, or
//! force its HBM down to a cap, on its control socket.

use super::args::{CapArgs, LimitsArgs};
use super::{optional, running_server, size};
use std::time::{Duration, Instant};
use tiermem_swap::control::{self, Request, RunDir};

pub(super) fn limits(args: LimitsArgs) -> Result<(), String> {
    let socket = running_server(&RunDir::from_env())?;
    if args.soft.is_none() && args.hard.is_none() {
        return Err("give --soft, --hard or both".into());
    }
    let request = Request::SetLimits { soft_bytes: args.soft, hard_bytes: args.hard };
    let reply = control::call(&socket, &request, Some(Instant::now() + Duration::from_secs(30)), &mut |_| {})?;
    println!(
        "tiermem swap: limits in free VRAM: soft {}, hard {}",
        optional(reply["soft_bytes"].as_u64()),
        optional(reply["hard_bytes"].as_u64())
    );
    Ok(())
}

pub(super) fn cap(args: CapArgs) -> Result<(), String> {
    let socket = running_server(&RunDir::from_env())?;
    let request = Request::SetCap { bytes: args.size.0 };
    let wait = args.timeout.map(|s| Instant::now() + Duration::from_secs_f64(s.max(0.0)));
    let reply = control::call(&socket, &request, wait, &mut |_| {})?;
    if args.json {
        println!("{reply}");
        return Ok(());
    }
    let seconds = reply["seconds"].as_f64().unwrap_or(0.0);
    let moved = reply["moved_bytes"].as_u64().unwrap_or(0);
    let rate = if seconds > 0.0 { format!(", {:.2} GB/s", moved as f64 / seconds / 1e9) } else { String::new() };
    println!(
        "tiermem swap: HBM cap {} met in {seconds:.3} s (moved {}{rate}; HBM now {})",
        optional(args.size.0),
        size(moved),
        size(reply["hbm_bytes"].as_u64().unwrap_or(0))
    );
    Ok(())
}
