//! The VRAM swap device under test, served by `tiermem swap on` (a server of its own): set up,
//! asked for its status, its HBM cap forced (give-back), taken down.

use super::command::{must, run_for};
use super::loop_device::detach;
use super::swap_areas::{active_swaps, swap_off};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A VRAM-backed swap device served by `tiermem swap on` (a server of its own); `tiermem swap
/// off` on drop, and if that fails, swapoff and detach of its loop devices.
pub struct VramSwap {
    exe: PathBuf,
    pub devices: Vec<String>,
}

/// The loop devices `tiermem swap on` prints, one per line.
pub fn parse_devices(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with("/dev/")))
        .map(|w| w.trim_end_matches([',', ':', ';']).to_string())
        .collect()
}

impl VramSwap {
    /// `tiermem swap on --size SIZE --spill SPILL [--no-enable] EXTRA…`.
    pub fn on(exe: &Path, size: u64, spill: &Path, enable: bool, extra: &[String]) -> Result<Self, String> {
        let exe_str = exe.to_str().ok_or("the tiermem binary's path is not UTF-8")?;
        let size = size.to_string();
        let spill = spill.to_str().ok_or("the spill file's path is not UTF-8")?;
        let mut args = vec!["swap", "on", "--size", &size, "--spill", spill];
        if !enable {
            args.push("--no-enable");
        }
        args.extend(extra.iter().map(String::as_str));
        let mut guard = VramSwap { exe: exe.to_path_buf(), devices: Vec::new() };
        // From here on, drop runs `swap off`, also if `swap on` failed half-way.
        let stdout = must(exe_str, &args, Duration::from_secs(300))?;
        guard.devices = parse_devices(&stdout);
        if guard.devices.is_empty() {
            return Err(format!("tiermem swap on printed no /dev/ device: {stdout:?}"));
        }
        Ok(guard)
    }

    /// The tiermem binary that serves the device.
    fn exe(&self) -> &str {
        self.exe.to_str().unwrap_or("tiermem")
    }

    /// `tiermem swap status --json`, or why not.
    pub fn status(&self) -> serde_json::Value {
        let out = run_for(self.exe(), &["swap", "status", "--json"], Duration::from_secs(30));
        match out {
            Ok(o) if o.ok => serde_json::from_str(o.stdout.trim())
                .unwrap_or_else(|e| serde_json::json!({"error": format!("not JSON ({e}): {}", o.stdout)})),
            Ok(o) => serde_json::json!({"error": o.tail()}),
            Err(e) => serde_json::json!({"error": e}),
        }
    }

    /// Forces the store's HBM cap to `bytes` (`tiermem swap cap BYTES --json`, whose reply is
    /// `{"ok":true,"cap_bytes":N,"seconds":S,"moved_bytes":M,"hbm_bytes":H}`): (seconds the
    /// move took, bytes moved to the file tier).
    pub fn set_cap(&self, bytes: u64) -> Result<(f64, f64), String> {
        let stdout = must(self.exe(), &["swap", "cap", &bytes.to_string(), "--json"], Duration::from_secs(300))?;
        parse_cap_reply(&stdout)
    }
}

/// The reply of `tiermem swap cap --json`: (seconds, bytes moved).
pub fn parse_cap_reply(stdout: &str) -> Result<(f64, f64), String> {
    let value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<serde_json::Value>(l.trim()).ok())
        .ok_or_else(|| format!("tiermem swap cap printed no JSON: {stdout:?}"))?;
    if value["ok"] == serde_json::json!(false) {
        return Err(format!("tiermem swap cap: {value}"));
    }
    let moved = value["moved_bytes"].as_f64().or_else(|| value["bytes"].as_f64());
    match (value["seconds"].as_f64(), moved) {
        (Some(s), Some(b)) => Ok((s, b)),
        _ => Err(format!("tiermem swap cap: no seconds and moved_bytes in {value}")),
    }
}

impl Drop for VramSwap {
    fn drop(&mut self) {
        match must(self.exe(), &["swap", "off"], Duration::from_secs(300)) {
            Ok(_) => {}
            Err(e) => {
                eprintln!("bench swap: {e}; taking its devices off by hand");
                for device in &self.devices {
                    let active = active_swaps().iter().any(|a| &a.filename == device);
                    if active {
                        let _ = swap_off(device);
                    }
                    let _ = detach(device);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swap_on_devices_and_cap_replies_are_read() {
        assert_eq!(parse_devices("/dev/loop3\n/dev/loop4\n"), vec!["/dev/loop3", "/dev/loop4"]);
        assert_eq!(parse_devices("serving on /dev/loop7, priority 100\n"), vec!["/dev/loop7"]);
        assert!(parse_devices("nothing\n").is_empty());
        let reply = r#"{"ok":true,"cap_bytes":0,"seconds":0.5,"moved_bytes":1000,"hbm_bytes":0}"#;
        assert_eq!(parse_cap_reply(&format!("moving…\n{reply}\n")), Ok((0.5, 1000.0)));
        assert!(parse_cap_reply(r#"{"ok":false,"error":"no file tier"}"#).is_err());
        assert!(parse_cap_reply("{\"ok\": true}").is_err());
    }
}
