//! Swap areas: those active (/proc/swaps), those that were active before the benchmark (taken
//! off so that each measurement has its swap alone, put back at the end), and those the
//! benchmark switches on itself (switched off on drop).

use super::command::must;
use super::warn_if_failed;
use std::time::Duration;

/// An active swap area, as /proc/swaps lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct SwapArea {
    pub path: String,
    pub kind: String,
    pub size_kib: u64,
    pub used_kib: u64,
    pub priority: i64,
}

/// Parses /proc/swaps (paths there escape a space as `\040`).
pub fn parse_swaps(text: &str) -> Vec<SwapArea> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [path, kind, size, used, priority] = f[..] else { return None };
            Some(SwapArea {
                path: path.replace("\\040", " "),
                kind: kind.to_string(),
                size_kib: size.parse().ok()?,
                used_kib: used.parse().ok()?,
                priority: priority.parse().ok()?,
            })
        })
        .collect()
}

pub fn active_swaps() -> Vec<SwapArea> {
    parse_swaps(&std::fs::read_to_string("/proc/swaps").unwrap_or_default())
}

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
            eprintln!("bench swap: swapoff {} (active before the benchmark; put back at the end)", area.path);
            swap_off(&area.path)?;
        }
        Ok(guard)
    }
}

impl Drop for OtherSwapsOff {
    fn drop(&mut self) {
        let now = active_swaps();
        for area in &self.before {
            if !now.iter().any(|a| a.path == area.path) {
                let priority = area.priority.to_string();
                let args: Vec<&str> =
                    if area.priority >= 0 { vec!["-p", &priority, &area.path] } else { vec![&area.path] };
                if let Err(e) = must("swapon", &args, Duration::from_secs(60)) {
                    eprintln!("bench swap: could not put back swap area {}: {e}", area.path);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_swaps_is_parsed_with_escaped_spaces() {
        let text = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n\
                    /dev/loop3                              partition\t16777212\t0\t\t100\n\
                    /scratch/my\\040swap                     file\t\t8388604\t\t1024\t\t-2\n";
        let areas = parse_swaps(text);
        assert_eq!(areas.len(), 2);
        assert_eq!(
            areas[0],
            SwapArea {
                path: "/dev/loop3".into(),
                kind: "partition".into(),
                size_kib: 16777212,
                used_kib: 0,
                priority: 100
            }
        );
        assert_eq!(areas[1].path, "/scratch/my swap");
        assert_eq!(areas[1].priority, -2);
        assert!(parse_swaps("Filename Type Size Used Priority\n").is_empty());
    }
}
