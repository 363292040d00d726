//! Where tenants and the daemon meet: the socket's path.
//!
//! 1. `$TIERMEM_SOCKET`, when set;
//! 2. `/run/tiermem/tiermemd.sock`: the system daemon's (systemd unit, DaemonSet);
//! 3. `$XDG_RUNTIME_DIR/tiermem.sock`: a daemon run by a user without root.
//!
//! The daemon listens on the first it may use (1, else 2 where `/run/tiermem` can be made or
//! written, else 3); a client connects to the first that exists.

use std::path::{Path, PathBuf};

pub const SYSTEM_SOCKET: &str = "/run/tiermem/tiermemd.sock";

fn from_env() -> Option<PathBuf> {
    std::env::var_os("TIERMEM_SOCKET").filter(|v| !v.is_empty()).map(PathBuf::from)
}

fn user_socket() -> Option<PathBuf> {
    std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()).map(|d| PathBuf::from(d).join("tiermem.sock"))
}

/// The socket a client should connect to, if one exists.
pub fn client_socket() -> Option<PathBuf> {
    if let Some(path) = from_env() {
        return Some(path);
    }
    [Some(PathBuf::from(SYSTEM_SOCKET)), user_socket()].into_iter().flatten().find(|p| p.exists())
}

/// The socket the daemon should listen on.
pub fn daemon_socket() -> Option<PathBuf> {
    if let Some(path) = from_env() {
        return Some(path);
    }
    let system = Path::new(SYSTEM_SOCKET);
    let dir = system.parent()?;
    if std::fs::create_dir_all(dir).is_ok() && writable(dir) {
        return Some(system.to_owned());
    }
    user_socket()
}

fn writable(dir: &Path) -> bool {
    let probe = dir.join(format!(".tiermemd-probe-{}", std::process::id()));
    let ok = std::fs::File::create(&probe).is_ok();
    let _ = std::fs::remove_file(&probe);
    ok
}
