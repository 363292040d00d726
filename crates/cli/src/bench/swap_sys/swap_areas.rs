//! Swap areas: those active (/proc/swaps), those that were active before the benchmark (taken
//! off so that each measurement has its swap alone, put back at the end), and those the
//! benchmark switches on itself (switched off on drop).

use super::command::must;
use super::warn_if_failed;
use std::time::Duration;

/// The swap areas active now (/proc/swaps, as the swap server reads it).
pub use tiermem_swap::system::swap_areas as active_swaps;
use tiermem_swap::system::SwapArea;

/// `swapoff PATH`, given 300 s (moving what it holds back into RAM can take a while).
pub fn swap_off(path: &str) -> Result<String, String> {
    must("swapoff", &[path], Duration::from_secs(300))
}

/// The swap areas that were active when the benchmark began, taken off so that each
/// measurement has its swap alone; put back, with their priorities, on drop.
pub struct OtherSwapsOff {
    pub before: Vec<SwapArea>,
}

impl OtherSwapsOff {
    /// Takes every active swap area off. An area that cannot be taken off is an error (the
    /// guard then puts back those that were).
    pub fn take() -> Result<Self, String> {
        let guard = OtherSwapsOff { before: active_swaps() };
        for area in &guard.before {
            eprintln!("bench swap: swapoff {} (active before the benchmark; put back at the end)", area.filename);
            swap_off(&area.filename)?;
        }
        Ok(guard)
    }
}

impl Drop for OtherSwapsOff {
    fn drop(&mut self) {
        let now = active_swaps();
        for area in &self.before {
            if !now.iter().any(|a| a.filename == area.filename) {
                let priority = area.priority.to_string();
                let args: Vec<&str> =
                    if area.priority >= 0 { vec!["-p", &priority, &area.filename] } else { vec![&area.filename] };
                if let Err(e) = must("swapon", &args, Duration::from_secs(60)) {
                    eprintln!("bench swap: could not put back swap area {}: {e}", area.filename);
                }
            }
        }
    }
}

/// A swap area switched on by us (a file or a device), switched off on drop.
pub struct SwapOn(pub String);

impl SwapOn {
    pub fn enable(path: &str, priority: i32) -> Result<Self, String> {
        must("mkswap", &[path], Duration::from_secs(60))?;
        must("swapon", &["-p", &priority.to_string(), path], Duration::from_secs(60))?;
        Ok(SwapOn(path.to_string()))
    }
}

impl Drop for SwapOn {
    fn drop(&mut self) {
        warn_if_failed(swap_off(&self.0));
    }
}
