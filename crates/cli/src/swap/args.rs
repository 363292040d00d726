//! The arguments of `tiermem swap …`: sizes and limits as given on the command line, the
//! device's settings that `swap on` hands on to the server it starts, and each subcommand's own.

use std::path::PathBuf;
use tiermem::format_size;
use tiermem_swap::serve::StoreKind;

fn parse_bytes(text: &str) -> Result<u64, String> {
    tiermem::parse_size(text).map(|b| b as u64)
}

/// A size, or `none`.
fn parse_limit(text: &str) -> Result<Limit, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "none" | "off" | "max" => Ok(Limit(None)),
        _ => parse_bytes(text).map(|b| Limit(Some(b))),
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Limit(pub(super) Option<u64>);

const DEFAULT_SPILL: &str = "/var/tmp/tiermem/swap-spill";

/// What `swap on` and the server it starts share.
#[derive(clap::Args, Clone, Debug)]
pub struct DeviceArgs {
    /// The device's size (e.g. 16GiB): at most the GPU's free memory plus the spill file.
    #[arg(long, value_parser = parse_bytes)]
    pub(super) size: u64,
    /// The GPU whose memory holds the pages.
    #[arg(long, default_value_t = 0)]
    pub(super) gpu: usize,
    /// Swap priority (0 to 32767): above any disk swap, so the kernel uses this first.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i32).range(0..=32767))]
    pub(super) priority: i32,
    /// The file tier's file, where pages go when VRAM is short or wanted back (never on tmpfs).
    #[arg(long, default_value = DEFAULT_SPILL)]
    pub(super) spill: PathBuf,
    /// The spill file's size (default: --size; 0: no file tier).
    #[arg(long, value_parser = parse_bytes)]
    pub(super) spill_size: Option<u64>,
    /// Loop devices at one priority, each over its own slice: the kernel spreads swap I/O
    /// across them.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub(super) devices: u16,
    /// GAME's soft limit, in free VRAM: the device takes no more VRAM while less than this is
    /// free on the GPU, leaving it to GPU work (default 4GiB).
    #[arg(long, value_parser = parse_bytes)]
    pub(super) soft_limit: Option<u64>,
    /// GAME's hard limit, in free VRAM: below this free, the device gives VRAM back, moving
    /// pages to the spill file (default 2GiB; at most the soft limit).
    #[arg(long, value_parser = parse_bytes)]
    pub(super) hard_limit: Option<u64>,
    /// Serve the block devices without making them swap (for fio on the raw devices).
    #[arg(long)]
    pub(super) no_enable: bool,
    /// FUSE server threads (default: the cores, 2 to 8).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub(super) threads: Option<u16>,
    /// Tests only: serve the FUSE files without loop devices or swap.
    #[arg(long, hide = true)]
    pub(super) no_loop: bool,
    /// Tests only: `memory` serves from host memory instead of the engine.
    #[arg(long, hide = true, default_value = "engine")]
    pub(super) store: String,
}

impl DeviceArgs {
    pub(super) fn check(&self) -> Result<(), String> {
        if self.size == 0 {
            return Err("--size must be more than 0".into());
        }
        tiermem_swap::fuse_server::split_devices(self.size, self.devices as usize)?;
        if let (Some(soft), Some(hard)) = (self.soft_limit, self.hard_limit) {
            if hard > soft {
                return Err(format!(
                    "--hard-limit {} is above --soft-limit {}: both are free VRAM, and the device gives back (hard) \
                     only below where it stops taking (soft)",
                    format_size(hard as usize),
                    format_size(soft as usize)
                ));
            }
        }
        tiermem_swap::serve::limits_for(self.soft_limit, self.hard_limit)?;
        self.store_kind()?;
        Ok(())
    }

    pub(super) fn store_kind(&self) -> Result<StoreKind, String> {
        match self.store.as_str() {
            "engine" => Ok(StoreKind::Engine),
            "memory" => Ok(StoreKind::Memory),
            other => Err(format!("--store {other:?}: engine or memory")),
        }
    }

    /// The same arguments, for the server's command line.
    pub(super) fn to_args(&self) -> Vec<String> {
        let mut args = vec![
            format!("--size={}", self.size),
            format!("--gpu={}", self.gpu),
            format!("--priority={}", self.priority),
            format!("--spill={}", self.spill.display()),
            format!("--devices={}", self.devices),
            format!("--store={}", self.store),
        ];
        let optional = [
            ("--spill-size", self.spill_size),
            ("--soft-limit", self.soft_limit),
            ("--hard-limit", self.hard_limit),
            ("--threads", self.threads.map(u64::from)),
        ];
        args.extend(optional.iter().filter_map(|(flag, v)| v.map(|v| format!("{flag}={v}"))));
        args.extend(self.no_enable.then(|| "--no-enable".to_string()));
        args.extend(self.no_loop.then(|| "--no-loop".to_string()));
        args
    }
}

#[derive(clap::Args)]
pub struct OnArgs {
    #[command(flatten)]
    pub(super) device: DeviceArgs,
}

#[derive(clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub(super) device: DeviceArgs,
    /// A descriptor to report readiness (one JSON line) on.
    #[arg(long)]
    pub(super) notify_fd: Option<i32>,
}

#[derive(clap::Args)]
pub struct OffArgs {
    /// Give up waiting after this many seconds (the server goes on stopping; run `off` again to
    /// wait). Default: wait as long as swapoff takes.
    #[arg(long)]
    pub(super) timeout: Option<f64>,
}

#[derive(clap::Args)]
pub struct SwapStatusArgs {
    /// Print JSON (for scripts): `{"running": false}`, or `"running": true` and the server's
    /// report.
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(clap::Args)]
pub struct LimitsArgs {
    /// The soft limit, in free VRAM: take no more while less is free; unchanged when not given.
    #[arg(long, value_parser = parse_bytes)]
    pub(super) soft: Option<u64>,
    /// The hard limit, in free VRAM: give back while less is free; unchanged when not given.
    #[arg(long, value_parser = parse_bytes)]
    pub(super) hard: Option<u64>,
}

#[derive(clap::Args)]
pub struct CapArgs {
    /// The HBM the device may keep (e.g. 0, 2GiB), or none.
    #[arg(value_parser = parse_limit)]
    pub(super) size: Limit,
    /// Give up waiting after this many seconds (the cap stays set).
    #[arg(long)]
    pub(super) timeout: Option<f64>,
    /// Print the server's reply as JSON.
    #[arg(long)]
    pub(super) json: bool,
}
