//! `tiermemd`, the node daemon: one per server, it shares each GPU's HBM (and, when
//! configured, the node's pinned host memory and file tier) among the processes using tiermem.
//!
//! ```text
//!  tenant engines ──Unix socket (tiermem-protocol)──▶ server.rs (tokio: sockets, timers)
//!                                                        │ events
//!                                                        ▼
//!                               registry.rs (tenants, pools, staged budgets) ── config.rs
//!                                                        │
//!                                                        ▼
//!                               tiermem_policy::share (weighted max-min fair share)
//! ```
//!
//! metrics.rs serves Prometheus metrics (`GET /metrics`) from the same registry; census.rs
//! keeps each GPU's accounts against what its driver counts (NVML); lending.rs decides which
//! lender's exported slabs (`tiermem lend`) go to which tenant and when they come back.
//!
//! Each tenant registers its engine and reports what it holds; the daemon answers with
//! budgets (`Engine::set_hbm_budget` on the tenant side, crate `tiermem-tenant`). A tenant
//! that asks for more than its share (a hog) or never frees (a leak) is held to its share: the
//! rest of its data lives in the tiers below. One that dies gives its share back at once. The
//! daemon holds no GPU memory and makes no CUDA context: capacities come from its
//! configuration or from what tenants report of their GPU, limited by what NVML says the
//! GPU's other users hold (census.rs). See docs/daemon.md.

pub mod census;
pub mod config;
pub mod lending;
mod metrics;
mod peer;
pub mod registry;
pub mod server;
mod spawned;
mod wire;

pub use config::Config;
pub use server::{bind, run, serve, serve_with_metrics};
pub use spawned::{spawn, Spawned};

/// How the daemon introduces itself.
pub const DAEMON_NAME: &str = concat!("tiermemd ", env!("CARGO_PKG_VERSION"));

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("tiermemd config: {0}")]
    Config(String),
    #[error("tiermemd socket {path}: {source} (choose another with --socket or TIERMEM_SOCKET)")]
    Socket { path: std::path::PathBuf, source: std::io::Error },
    #[error("a tiermemd already answers on {0}: stop it first, or give this one another --socket")]
    AlreadyRunning(std::path::PathBuf),
    #[error("tiermemd metrics on {address}: {source} (choose another address, or leave `metrics` out)")]
    Metrics { address: String, source: std::io::Error },
    #[error("no socket path: set TIERMEM_SOCKET or XDG_RUNTIME_DIR, or pass --socket")]
    NoSocketPath,
}

/// A line on stderr, with the seconds since the Unix epoch (journald adds its own time).
pub(crate) fn log(line: &str) {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    eprintln!("tiermemd [{:.3}] {line}", now.as_secs_f64());
}
