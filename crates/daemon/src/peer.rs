//! Who a peer is beyond its uid and pid (`SO_PEERCRED`, read by tokio): its cgroup, which maps
//! containers (and systemd services) to tenants.

/// The cgroup of `pid`: the cgroup v2 path (`0::/…`), else the first hierarchy's.
pub fn cgroup_of(pid: u32) -> Option<String> {
    if pid == 0 {
        return None;
    }
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    parse_cgroup(&text)
}

fn parse_cgroup(text: &str) -> Option<String> {
    let path = |line: &str| line.splitn(3, ':').nth(2).map(str::to_owned);
    text.lines().find(|l| l.starts_with("0::")).and_then(path).or_else(|| text.lines().next().and_then(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_v2_wins_over_v1_lines() {
        let mixed = "12:memory:/v1/path\n0::/kubepods/burstable/pod42/abc\n";
        assert_eq!(parse_cgroup(mixed).as_deref(), Some("/kubepods/burstable/pod42/abc"));
        assert_eq!(parse_cgroup("4:cpu,cpuacct:/user.slice\n").as_deref(), Some("/user.slice"));
        assert_eq!(parse_cgroup(""), None);
    }

    #[test]
    fn our_own_cgroup_reads() {
        assert!(cgroup_of(std::process::id()).is_some_and(|c| c.starts_with('/')));
    }
}
