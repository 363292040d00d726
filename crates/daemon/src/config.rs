//! The daemon's configuration (TOML): capacities, how long a tenant has to meet a smaller
//! budget, who may see what, and the tenants: matched by uid, cgroup or label, each with a
//! weight, a priority and optional hard quotas per tier. `docs/daemon.md` has an example.
//!
//! Sizes are bytes or strings such as `"16GiB"`. A tenant entry matches a connection when
//! every selector it gives matches (`cgroup` as a path prefix); the first entry that matches
//! wins, and connections that match none get `[default]`.

use crate::DaemonError;
use serde::Deserialize;
use std::collections::BTreeMap;
use tiermem_protocol::Tier;

/// A size in a config file: an integer or a string like "16GiB".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "SizeText")]
pub struct Size(pub u64);

#[derive(Deserialize)]
#[serde(untagged)]
enum SizeText {
    Bytes(u64),
    Text(String),
}

impl TryFrom<SizeText> for Size {
    type Error = String;
    fn try_from(value: SizeText) -> Result<Self, String> {
        match value {
            SizeText::Bytes(n) => Ok(Size(n)),
            SizeText::Text(t) => tiermem::parse_size(&t).map(|n| Size(n as u64)),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// How long a tenant has to meet a smaller budget before it is marked late and the daemon
    /// stops reserving what it held beyond its reported use.
    #[serde(default = "default_deadline_ms")]
    pub deadline_ms: u64,
    /// A tenant that has acquired nothing for this long is idle: what it holds beyond its
    /// largest acquire is lent to the others until it acquires again (registry.rs, "Idle
    /// tenants"). 0: never.
    #[serde(default = "default_idle_after_ms")]
    pub idle_after_ms: u64,
    /// A new tenant is *ramping up* until its HBM demand has held still this long: it keeps its
    /// whole part rather than lend what it does not use yet (registry.rs, "Tenants ramping
    /// up"). 0: never.
    #[serde(default = "default_ramp_ms")]
    pub ramp_ms: u64,
    /// How a GPU's HBM is shared among working tenants whose working sets do not all fit:
    /// `auto` (the default: in turns while every tenant of the GPU is a program that can wait
    /// for its turn, each of another job; fair share otherwise), `fair` (weighted fair share)
    /// or `working-sets` (as many whole working sets as fit, in turns; registry/turns.rs).
    #[serde(default)]
    pub hbm_sharing: Sharing,
    /// In turns: how long a tenant's turn with its whole working set lasts while
    /// others wait for theirs (ms). 30 s by default: each hand-over sends one working set down
    /// and the next up (~2–3 s for 12–16 GiB on the H200), and two programs larger than a
    /// 12 GiB share finished in 0.97× their serial time in 30 s turns, 1.23× in 10 s turns
    /// (BENCHMARKS.md, forty-third session).
    #[serde(default = "default_turn_ms")]
    pub turn_ms: u64,
    /// HBM left out of a GPU's capacity when `[[gpu]]` does not give it (not on the simulated
    /// device): the CUDA context and libraries of each process take some.
    #[serde(default = "default_reserve")]
    pub hbm_reserve: Size,
    /// The socket's permission bits (octal text, e.g. "0660"): who may connect.
    #[serde(default = "default_socket_mode")]
    pub socket_mode: String,
    /// Where to serve Prometheus metrics (`GET /metrics`), e.g. "127.0.0.1:9464"; none: off.
    pub metrics: Option<String>,
    #[serde(default)]
    pub status: StatusConfig,
    /// HBM lent between processes (`tiermem lend`): deadlines, escalation, who may lend.
    #[serde(default)]
    pub lending: crate::lending::LendingConfig,
    /// Node-wide capacities of the host and file tiers (shared out only when given).
    #[serde(default)]
    pub tiers: NodeTiers,
    #[serde(default, rename = "gpu")]
    pub gpus: Vec<GpuConfig>,
    #[serde(default)]
    pub default: TenantRule,
    #[serde(default, rename = "tenant")]
    pub tenants: Vec<TenantRule>,
}

/// How a GPU's HBM is shared among working tenants (`hbm_sharing`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sharing {
    /// `working-sets` on a GPU while every tenant of it registered `waits` (a program under
    /// `tiermem run`, which is held while it waits) and belongs to a job of its own with no
    /// tenant on another GPU (protocol: `register`'s `job`; processes of one job may wait on
    /// each other, across GPUs too); `fair` otherwise. Programs held in turns finish together
    /// in less than the time they take one after the other, where under fair share each reads
    /// what it lacks in place and the driver's remapping crawls for the other (≥ 4.5× slower
    /// on the H200: BENCHMARKS.md, forty-second to forty-fourth sessions); engines, which
    /// cannot be held, keep fair share.
    #[default]
    Auto,
    /// Weighted max-min fair share (`tiermem_policy::share`): every busy tenant gets its part.
    Fair,
    /// Whole working sets first, in turns (`tiermem_policy::admission`): for batch jobs, whose
    /// throughput matters more than each one's share at every instant.
    WorkingSets,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusConfig {
    /// Every connection may see every tenant.
    #[serde(default)]
    pub public: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeTiers {
    /// HBM that neighbour GPUs lend, all tenants' borrowing together (each tenant's engine
    /// still borrows only what its lenders can spare).
    pub peer: Option<Size>,
    pub host: Option<Size>,
    pub file: Option<Size>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuConfig {
    pub index: u32,
    /// The HBM shared among this GPU's tenants.
    pub hbm: Size,
}

/// A configured tenant (or the default for everyone else).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantRule {
    #[serde(default = "default_name")]
    pub name: String,
    pub uid: Option<u32>,
    /// A cgroup path prefix (`/kubepods/…`, `/system.slice/x.service`).
    pub cgroup: Option<String>,
    pub label: Option<String>,
    #[serde(default = "default_weight")]
    pub weight: u32,
    #[serde(default)]
    pub priority: i32,
    /// Hard limits per tier (`hbm`, `host`, `file`).
    #[serde(default)]
    pub quota: BTreeMap<Tier, Size>,
    /// May see every tenant in `tiermem status`.
    #[serde(default)]
    pub see_all: bool,
}

impl Default for TenantRule {
    fn default() -> Self {
        Self {
            name: default_name(),
            uid: None,
            cgroup: None,
            label: None,
            weight: 1,
            priority: 0,
            quota: BTreeMap::new(),
            see_all: false,
        }
    }
}

fn default_deadline_ms() -> u64 {
    2000
}
fn default_idle_after_ms() -> u64 {
    10_000
}
fn default_ramp_ms() -> u64 {
    3000
}
fn default_turn_ms() -> u64 {
    30_000
}
fn default_reserve() -> Size {
    Size(2 << 30)
}
fn default_socket_mode() -> String {
    "0666".into()
}
fn default_name() -> String {
    "default".into()
}
fn default_weight() -> u32 {
    1
}

impl Default for Config {
    fn default() -> Self {
        Self {
            deadline_ms: default_deadline_ms(),
            idle_after_ms: default_idle_after_ms(),
            ramp_ms: default_ramp_ms(),
            hbm_sharing: Sharing::default(),
            turn_ms: default_turn_ms(),
            hbm_reserve: default_reserve(),
            socket_mode: default_socket_mode(),
            metrics: None,
            status: StatusConfig::default(),
            lending: crate::lending::LendingConfig::default(),
            tiers: NodeTiers::default(),
            gpus: Vec::new(),
            default: TenantRule::default(),
            tenants: Vec::new(),
        }
    }
}

/// Who is connecting: from the kernel (`SO_PEERCRED`, `/proc/<pid>/cgroup`) and the tenant's
/// own label.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub pid: u32,
    pub cgroup: Option<String>,
    pub label: Option<String>,
}

impl Config {
    /// Parses a config file's text; errors name the file and what is wrong.
    pub fn parse(text: &str, origin: &str) -> Result<Self, DaemonError> {
        let config: Config =
            toml::from_str(text).map_err(|e| DaemonError::Config(format!("{origin}: {}", e.message())))?;
        config.validate(origin)?;
        Ok(config)
    }

    pub fn load(path: &std::path::Path) -> Result<Self, DaemonError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| DaemonError::Config(format!("reading {}: {e}", path.display())))?;
        Self::parse(&text, &path.display().to_string())
    }

    fn validate(&self, origin: &str) -> Result<(), DaemonError> {
        for rule in self.tenants.iter().chain([&self.default]) {
            if rule.weight == 0 {
                return Err(DaemonError::Config(format!(
                    "{origin}: tenant {:?} has weight 0 (use 1 or more)",
                    rule.name
                )));
            }
        }
        if let Some(rule) = self.tenants.iter().find(|r| r.uid.is_none() && r.cgroup.is_none() && r.label.is_none()) {
            return Err(DaemonError::Config(format!(
                "{origin}: tenant {:?} gives no uid, cgroup or label to match (put it in [default] instead)",
                rule.name
            )));
        }
        for (i, gpu) in self.gpus.iter().enumerate() {
            if let Some(first) = self.gpus[..i].iter().position(|h| h.index == gpu.index) {
                return Err(DaemonError::Config(format!(
                    "{origin}: GPU {} is given twice ([[gpu]] entries {} and {}): give each GPU one entry",
                    gpu.index,
                    first + 1,
                    i + 1
                )));
            }
        }
        self.socket_mode_bits().map(|_| ()).map_err(|e| DaemonError::Config(format!("{origin}: {e}")))
    }

    pub fn socket_mode_bits(&self) -> Result<u32, String> {
        u32::from_str_radix(self.socket_mode.trim_start_matches("0o"), 8)
            .ok()
            .filter(|m| *m <= 0o777)
            .ok_or_else(|| format!("socket_mode = {:?} is not octal permission bits like \"0660\"", self.socket_mode))
    }

    /// The tenant entry `who` matches (the first in file order), or the default.
    pub fn rule_for(&self, who: &Identity) -> &TenantRule {
        let matches = |rule: &&TenantRule| {
            rule.uid.is_none_or(|uid| uid == who.uid)
                && rule.label.as_ref().is_none_or(|l| who.label.as_ref() == Some(l))
                && rule.cgroup.as_ref().is_none_or(|prefix| who.cgroup.as_ref().is_some_and(|c| c.starts_with(prefix)))
        };
        self.tenants.iter().find(matches).unwrap_or(&self.default)
    }

    /// The HBM shared among the tenants of GPU `index`: configured, or its memory less the
    /// reserve (all of a simulated device).
    pub fn hbm_capacity(&self, index: u32, total_bytes: u64, simulated: bool) -> u64 {
        match self.gpus.iter().find(|g| g.index == index) {
            Some(gpu) => gpu.hbm.0,
            None if simulated => total_bytes,
            None => total_bytes.saturating_sub(self.hbm_reserve.0),
        }
    }

    /// The node-wide capacity of `tier`, when it is shared out.
    pub fn node_capacity(&self, tier: Tier) -> Option<u64> {
        match tier {
            // Per GPU, not node-wide.
            Tier::Hbm => None,
            Tier::Peer => self.tiers.peer.map(|s| s.0),
            Tier::Host => self.tiers.host.map(|s| s.0),
            Tier::File => self.tiers.file.map(|s| s.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
        deadline_ms = 1500
        [tiers]
        host = "64GiB"
        [[gpu]]
        index = 0
        hbm = "70GiB"
        [[tenant]]
        name = "training"
        uid = 1000
        weight = 2
        quota = { hbm = "40GiB" }
        [[tenant]]
        name = "pods"
        cgroup = "/kubepods"
        priority = -1
        [[tenant]]
        name = "llm"
        label = "llm"
        see_all = true
    "#;

    #[test]
    fn the_example_parses_and_matches_by_uid_cgroup_and_label() {
        let c = Config::parse(EXAMPLE, "example").unwrap();
        assert_eq!(c.deadline_ms, 1500);
        assert_eq!(c.hbm_capacity(0, 141 << 30, false), 70 << 30);
        assert_eq!(c.hbm_capacity(1, 10 << 30, false), 8 << 30);
        assert_eq!(c.hbm_capacity(1, 10 << 30, true), 10 << 30);
        assert_eq!(c.node_capacity(Tier::Host), Some(64 << 30));
        let who = |uid, cgroup: Option<&str>, label: Option<&str>| Identity {
            uid,
            pid: 1,
            cgroup: cgroup.map(str::to_owned),
            label: label.map(str::to_owned),
        };
        let training = c.rule_for(&who(1000, None, None));
        assert_eq!(
            (training.name.as_str(), training.weight, training.quota[&Tier::Hbm]),
            ("training", 2, Size(40 << 30))
        );
        assert_eq!(c.rule_for(&who(7, Some("/kubepods/burstable/pod1"), None)).name, "pods");
        assert_eq!(c.rule_for(&who(7, Some("/system.slice"), Some("llm"))).name, "llm");
        assert_eq!(c.rule_for(&who(7, None, None)).name, "default");
    }

    #[test]
    fn mistakes_are_named() {
        let unknown = Config::parse("weight = 3", "f.toml").unwrap_err().to_string();
        assert!(unknown.contains("f.toml") && unknown.contains("weight"), "{unknown}");
        let zero = Config::parse("[[tenant]]\nname = \"x\"\nuid = 1\nweight = 0", "f").unwrap_err().to_string();
        assert!(zero.contains("weight 0"), "{zero}");
        let unmatched = Config::parse("[[tenant]]\nname = \"x\"", "f").unwrap_err().to_string();
        assert!(unmatched.contains("no uid, cgroup or label"), "{unmatched}");
        let size = Config::parse("[tiers]\nhost = \"lots\"", "f").unwrap_err().to_string();
        assert!(size.contains("lots"), "{size}");
        assert!(Config::parse("socket_mode = \"999\"", "f").is_err());
        let gpu = |i: u32| format!("[[gpu]]\nindex = {i}\nhbm = \"1GiB\"\n");
        let twice = Config::parse(&[gpu(0), gpu(1), gpu(0)].concat(), "f").unwrap_err().to_string();
        assert!(twice.contains("GPU 0 is given twice ([[gpu]] entries 1 and 3)"), "{twice}");
        assert!(Config::parse(&[gpu(0), gpu(1)].concat(), "f").is_ok());
    }
}
