use crate::{Error, Result};
use tiermem_mechanism::BackendChoice;
use tiermem_policy::PolicyKind;

/// The chunk by default (`TIERMEM_CHUNK`): two granules on the H200. Each chunk pays its VMM
/// calls (making 10–18 µs, mapping 24–47 µs) whatever its size; at 4 MiB they hide behind its
/// copy (76 µs at 55 GB/s), at 2 MiB they do not. Measured in one call each on the H200 against
/// 2 MiB: a wake after the HBM went back 0.92–0.94 of PCIe against 0.54–0.85, an oversubscribed
/// random cycle 38.7 against 27.1 GB/s, a learned loop 61.4 against 41.2 GB/s, tenants 45.6
/// against 42.4 GB/s, decodes alike (BENCHMARKS.md, twenty-third session).
pub const DEFAULT_CHUNK: usize = 4 << 20;

/// The window a loop learned from acquires pages ahead by default (`TIERMEM_LEARN_LOOPS=on`).
const LEARNED_WINDOW: usize = 256 << 20;

/// How an [`crate::Engine`] is set up. `EngineConfig::from_env()` reads the `TIERMEM_*`
/// variables; every field can also be set directly.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// `TIERMEM_BACKEND=auto|cuda|sim`; auto uses CUDA when a driver and GPU are present.
    pub backend: BackendChoice,
    /// `TIERMEM_DEVICE`: GPU ordinal.
    pub device: usize,
    /// `TIERMEM_HBM_LIMIT`: bytes of HBM the engine may hold. Default: free memory at start
    /// minus `hbm_reserve`.
    pub hbm_limit: Option<usize>,
    /// HBM left to others when `hbm_limit` is not given.
    pub hbm_reserve: usize,
    /// `TIERMEM_HOST_LIMIT`: bytes of pinned host memory for the host tier. Default: half
    /// of the host's available memory when the engine starts.
    pub host_limit: Option<usize>,
    /// `TIERMEM_POLICY=lru|lru-cost|priority|random`.
    pub policy: PolicyKind,
    /// Seed for the randomised policies.
    pub seed: u64,
    /// Size of the simulated device's "HBM" (`TIERMEM_SIM_HBM`), raised to `hbm_limit` if
    /// that is larger. It must fit in the host's available memory, which stands in for it.
    pub sim_hbm: usize,
    /// Chunks per transfer batch: one `cuMemSetAccess` and one fence per batch.
    pub batch_chunks: usize,
    /// `TIERMEM_CHUNK`: bytes of a chunk, the unit that moves, rounded up to whole granules of
    /// the device (`tiermem_mechanism::chunked` says why larger ones move faster; larger ones
    /// also round buffers up more). Default [`DEFAULT_CHUNK`]; `None`: one granule.
    pub chunk: Option<usize>,
    /// `TIERMEM_FILE`: the file of the file (NVMe) tier; none: no file tier. The file is
    /// created, preallocated to `file_limit`, and removed when the engine is dropped.
    pub file: Option<std::path::PathBuf>,
    /// `TIERMEM_FILE_LIMIT`: the size of the file tier.
    pub file_limit: usize,
    /// `TIERMEM_FILE_IO=auto|uring|threads`: how the file tier does its I/O.
    pub file_io: tiermem_mechanism::file_store::IoChoice,
    /// `TIERMEM_FILE_QD`: slots in flight per file-tier call.
    pub file_queue_depth: u32,
    /// `TIERMEM_PEERS=auto|off|1,2`: the neighbour GPUs whose spare HBM the peer tier borrows.
    /// `auto`: every GPU this one has peer access to and on which no other process runs.
    pub peers: PeerChoice,
    /// `TIERMEM_PEER_RESERVE`: HBM left free on each lender. Default: 4 GiB on a GPU, none
    /// on the simulated device (as `hbm_reserve`).
    pub peer_reserve: Option<usize>,
    /// `TIERMEM_PEER_LIMIT`: the most HBM borrowed from all lenders together.
    pub peer_limit: Option<usize>,
    /// `TIERMEM_PEER_IN_PLACE=on|off` (default off): borrowed HBM is made one allocation per
    /// chunk, so that `Access::InPlaceOk` reads can be served where chunks lie. Off, a lender's
    /// memory goes back faster (one unmap per 64 MiB, not per chunk) and nothing is read in place.
    pub peer_in_place: bool,
    /// `TIERMEM_MULTIPATH=on|off` (default on): page-ins from host memory also come in through
    /// each lender's own PCIe link, its copy engine writing over NVLink (multipath.rs), while
    /// it lends. Costs a CUDA context on each lender.
    pub multipath: bool,
    /// `TIERMEM_PEER_BUSY_RATE` (bytes per second, e.g. `64GiB`; `off`): while a lender's own
    /// kernels run, the peer tier moves at most this much to and from its HBM, so that lending
    /// does not slow the lender's program (peer_traffic.rs); what does not go there goes to
    /// the host tier. Default 64 GiB/s; `off`: never held.
    pub peer_busy_rate: Option<usize>,
    /// `TIERMEM_PEER_CLEAN=on|off` (default on): chunks whose only copy is in a lender's HBM
    /// are copied to free host room in the background, so that the lender gets its memory back
    /// without waiting for a copy (movement.rs, "Cleaning borrowed chunks").
    pub peer_clean: bool,
    /// `TIERMEM_STRIDE_PREFETCH`: bytes brought in ahead of a buffer walked in one direction,
    /// when no schedule is set (stride.rs); 0 turns it off. Default 32 MiB.
    pub stride_prefetch: usize,
    /// `TIERMEM_LEARN_LOOPS=off|on|SIZE`: a program that acquires its buffers in the same order
    /// pass after pass, without naming its passes, has that order learned from its acquires and
    /// followed — Belady eviction, SIZE paged ahead (`on`: 256 MiB), at most an eighth of the
    /// HBM budget — for as long as it predicts (recorder.rs). Default on (256 MiB): on the H200
    /// three tenants cycling through 1.8× their node's HBM ran 1.9–2.2× faster with it
    /// (`bench tenants`, BENCHMARKS.md, eleventh session).
    pub learn_loops: Option<usize>,
    /// `TIERMEM_PRE_EVICT`: HBM kept free ahead of demand by starting evictions early, after
    /// each acquire (pre_evict.rs); 0 (the default, until measured) turns it off.
    pub pre_evict: usize,
    /// `TIERMEM_LOOK_PAST=on|off` (default off: no gain measured on the H200): with a schedule,
    /// paging ahead looks past steps whose chunks are all resident, for streamed chunks to swap
    /// in (schedule.rs, "Looking past resident steps").
    pub look_past: bool,
    /// `TIERMEM_SPREAD_RESIDENT=on|off` (default on): with a schedule followed by `advance`,
    /// the buffers kept resident for the whole pass are planned, spread along it, rather than
    /// left to Belady, which keeps one stretch (schedule.rs, "A planned resident set").
    pub spread_resident: bool,
    /// `TIERMEM_EVICT_ROOM=on|off` (default on): an engine linked to the node daemon pins host
    /// memory ahead, in the link's thread, for the chunks in HBM that have no copy below, so
    /// that a smaller budget is met at the speed of the copies, not of pinning (evict_room.rs).
    pub evict_room: bool,
    /// `TIERMEM_AHEAD_WAITS=on|off` (default off): paging ahead along a schedule waits for the
    /// chunks it evicts to leave, so that it brings in the whole window at once. Off, it starts
    /// them down and goes on: the program's host thread is not held while they leave, and what
    /// they free is filled by the next step's page-ahead (placement.rs, `bring_in`).
    pub ahead_waits: bool,
    /// `TIERMEM_SIM_GPUS`: GPUs of the simulated node (default 1), each of `sim_hbm`, with
    /// peer access to each other, so the peer tier can be tried without a GPU.
    pub sim_gpus: usize,
}

/// Which neighbour GPUs lend HBM to the peer tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerChoice {
    /// Those with peer access to this GPU and no other process on them.
    Auto,
    /// None: no peer tier.
    Off,
    /// These, by ordinal, whatever else runs on them.
    Gpus(Vec<usize>),
}

impl std::str::FromStr for PeerChoice {
    type Err = String;
    fn from_str(text: &str) -> std::result::Result<Self, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(Self::Auto),
            "off" | "none" => Ok(Self::Off),
            list => list
                .split(',')
                .map(|g| {
                    g.trim()
                        .parse::<usize>()
                        .map_err(|_| format!("{text:?}: expected auto, off or GPU ordinals like 1,2"))
                })
                .collect::<std::result::Result<Vec<_>, _>>()
                .map(Self::Gpus),
        }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            backend: BackendChoice::Auto,
            device: 0,
            hbm_limit: None,
            hbm_reserve: 2 << 30,
            host_limit: None,
            policy: PolicyKind::Lru,
            seed: 0x7135_3e3d,
            sim_hbm: 1 << 30,
            batch_chunks: 16,
            chunk: Some(DEFAULT_CHUNK),
            file: None,
            file_limit: 16 << 30,
            file_io: tiermem_mechanism::file_store::IoChoice::Auto,
            file_queue_depth: 32,
            peers: PeerChoice::Auto,
            peer_reserve: None,
            peer_limit: None,
            peer_in_place: false,
            multipath: true,
            peer_clean: true,
            peer_busy_rate: Some(64 << 30),
            stride_prefetch: 32 << 20,
            pre_evict: 0,
            look_past: false,
            spread_resident: true,
            ahead_waits: false,
            evict_room: true,
            learn_loops: Some(LEARNED_WINDOW),
            sim_gpus: 1,
        }
    }
}

impl EngineConfig {
    /// These settings with the peer tier's overridden by `TIERMEM_PEERS`, `TIERMEM_PEER_RESERVE`
    /// and `TIERMEM_PEER_LIMIT` where set (also what `tiermem run --peers` reads).
    pub fn peer_tier_from_env(mut self) -> Result<Self> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        if let Some(v) = var("TIERMEM_PEERS") {
            self.peers = v.parse().map_err(|e| Error::Config(format!("TIERMEM_PEERS: {e}")))?;
        }
        if let Some(v) = var("TIERMEM_PEER_RESERVE") {
            self.peer_reserve = Some(parse_size(&v).map_err(|e| Error::Config(format!("TIERMEM_PEER_RESERVE: {e}")))?);
        }
        if let Some(v) = var("TIERMEM_PEER_LIMIT") {
            self.peer_limit = Some(parse_size(&v).map_err(|e| Error::Config(format!("TIERMEM_PEER_LIMIT: {e}")))?);
        }
        Ok(self)
    }

    /// Defaults overridden by any `TIERMEM_*` variable that is set.
    pub fn from_env() -> Result<Self> {
        let mut c = Self::default();
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        if let Some(v) = var("TIERMEM_BACKEND") {
            c.backend = v.parse().map_err(|e| match e {
                tiermem_mechanism::DeviceError::Config(message) => Error::Config(message),
                other => Error::Config(other.to_string()),
            })?;
        }
        if let Some(v) = var("TIERMEM_DEVICE") {
            c.device =
                v.trim().parse().map_err(|_| Error::Config(format!("TIERMEM_DEVICE={v:?} is not a GPU ordinal")))?;
        }
        if let Some(v) = var("TIERMEM_HBM_LIMIT") {
            if v.trim().ends_with('%') {
                return Err(Error::Config(format!(
                    "TIERMEM_HBM_LIMIT={v:?}: a share of the GPU is for `tiermem run`; an engine (tiermem.Pool, the C ABI) takes a size such as 16GiB"
                )));
            }
            c.hbm_limit = Some(parse_size(&v).map_err(|e| Error::Config(format!("TIERMEM_HBM_LIMIT: {e}")))?);
        }
        if let Some(v) = var("TIERMEM_HOST_LIMIT") {
            c.host_limit = Some(parse_size(&v).map_err(|e| Error::Config(format!("TIERMEM_HOST_LIMIT: {e}")))?);
        }
        if let Some(v) = var("TIERMEM_SIM_HBM") {
            c.sim_hbm = parse_size(&v).map_err(|e| Error::Config(format!("TIERMEM_SIM_HBM: {e}")))?;
        }
        if let Some(v) = var("TIERMEM_CHUNK") {
            c.chunk = Some(parse_size(&v).map_err(|e| Error::Config(format!("TIERMEM_CHUNK: {e}")))?);
        }
        if let Some(v) = var("TIERMEM_FILE") {
            c.file = Some(v.into());
        }
        if let Some(v) = var("TIERMEM_FILE_LIMIT") {
            c.file_limit = parse_size(&v).map_err(|e| Error::Config(format!("TIERMEM_FILE_LIMIT: {e}")))?;
        }
        if let Some(v) = var("TIERMEM_FILE_IO") {
            c.file_io = v.parse().map_err(|e| Error::Config(format!("TIERMEM_FILE_IO: {e}")))?;
        }
        if let Some(v) = var("TIERMEM_FILE_QD") {
            c.file_queue_depth =
                v.trim().parse().map_err(|_| Error::Config(format!("TIERMEM_FILE_QD={v:?} is not a queue depth")))?;
        }
        c = c.peer_tier_from_env()?;
        if let Some(v) = var("TIERMEM_PEER_IN_PLACE") {
            c.peer_in_place = on_or_off("TIERMEM_PEER_IN_PLACE", &v)?;
        }
        if let Some(v) = var("TIERMEM_MULTIPATH") {
            c.multipath = on_or_off("TIERMEM_MULTIPATH", &v)?;
        }
        if let Some(v) = var("TIERMEM_STRIDE_PREFETCH") {
            c.stride_prefetch = parse_size(&v).map_err(|e| Error::Config(format!("TIERMEM_STRIDE_PREFETCH: {e}")))?;
        }
        if let Some(v) = var("TIERMEM_LEARN_LOOPS") {
            c.learn_loops = match v.trim().to_ascii_lowercase().as_str() {
                "off" | "none" => None,
                "on" => Some(LEARNED_WINDOW),
                size => Some(parse_size(size).map_err(|e| {
                    Error::Config(format!("TIERMEM_LEARN_LOOPS: {e}: on, off, or the bytes to page ahead"))
                })?),
            };
        }
        if let Some(v) = var("TIERMEM_LOOK_PAST") {
            c.look_past = on_or_off("TIERMEM_LOOK_PAST", &v)?;
        }
        if let Some(v) = var("TIERMEM_SPREAD_RESIDENT") {
            c.spread_resident = on_or_off("TIERMEM_SPREAD_RESIDENT", &v)?;
        }
        if let Some(v) = var("TIERMEM_AHEAD_WAITS") {
            c.ahead_waits = on_or_off("TIERMEM_AHEAD_WAITS", &v)?;
        }
        if let Some(v) = var("TIERMEM_EVICT_ROOM") {
            c.evict_room = on_or_off("TIERMEM_EVICT_ROOM", &v)?;
        }
        if let Some(v) = var("TIERMEM_PRE_EVICT") {
            c.pre_evict = parse_size(&v).map_err(|e| Error::Config(format!("TIERMEM_PRE_EVICT: {e}")))?;
        }
        if let Some(v) = var("TIERMEM_PEER_BUSY_RATE") {
            c.peer_busy_rate =
                match v.trim().to_ascii_lowercase().as_str() {
                    "off" | "none" => None,
                    rate => Some(parse_size(rate.strip_suffix("/s").unwrap_or(rate)).map_err(|e| {
                        Error::Config(format!("TIERMEM_PEER_BUSY_RATE: {e}, a rate like 64GiB/s, or off"))
                    })?),
                };
        }
        if let Some(v) = var("TIERMEM_PEER_CLEAN") {
            c.peer_clean = on_or_off("TIERMEM_PEER_CLEAN", &v)?;
        }
        if let Some(v) = var("TIERMEM_SIM_GPUS") {
            c.sim_gpus =
                v.trim().parse().ok().filter(|&n| n >= 1).ok_or_else(|| {
                    Error::Config(format!("TIERMEM_SIM_GPUS={v:?} is not a number of GPUs (1 or more)"))
                })?;
        }
        if let Some(v) = var("TIERMEM_POLICY") {
            c.policy = v.parse().map_err(|e| Error::Config(format!("TIERMEM_POLICY: {e}")))?;
        }
        Ok(c)
    }
}

impl EngineConfig {
    /// HBM each lender keeps free for its own users (`peer_reserve`, or its default).
    pub fn peer_reserve(&self, backend: tiermem_mechanism::BackendKind) -> usize {
        match (self.peer_reserve, backend) {
            (Some(reserve), _) => reserve,
            (None, tiermem_mechanism::BackendKind::Sim) => 0,
            (None, tiermem_mechanism::BackendKind::Cuda) => 4 << 30,
        }
    }

    /// The HBM cap this configuration gives on a device with `free` bytes free: the explicit
    /// limit, else all of the simulated device, else free memory minus `hbm_reserve`.
    pub fn hbm_cap(&self, backend: tiermem_mechanism::BackendKind, free: usize) -> usize {
        match (self.hbm_limit, backend) {
            (Some(limit), _) => limit,
            (None, tiermem_mechanism::BackendKind::Sim) => free,
            (None, tiermem_mechanism::BackendKind::Cuda) => free.saturating_sub(self.hbm_reserve),
        }
    }
}

/// Parses sizes such as `16GiB`, `512MiB`, `1.5G`, `2097152`: binary units (K, M, G, T with
/// or without `iB`/`B`), as `TIERMEM_HBM_LIMIT` and the command line accept them.
pub fn parse_size(text: &str) -> std::result::Result<usize, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number.parse().map_err(|_| format!("{text:?} is not a size like 16GiB"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => return Err(format!("{text:?}: unknown unit {other:?} (use KiB, MiB, GiB or TiB)")),
    };
    Ok((value * (1u64 << shift) as f64) as usize)
}

/// An HBM budget as `tiermem run --hbm-limit` and the preload library's `TIERMEM_HBM_LIMIT`
/// take it: a size (`parse_size`), or a share of each GPU's memory (`50%`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HbmLimit {
    Bytes(usize),
    /// A fraction in (0, 1].
    Share(f64),
}

impl HbmLimit {
    /// Parses `16GiB`, `2097152` or `50%` (more than 0, at most 100).
    pub fn parse(text: &str) -> std::result::Result<HbmLimit, String> {
        let Some(percent) = text.trim().strip_suffix('%') else { return parse_size(text).map(HbmLimit::Bytes) };
        match percent.trim().parse::<f64>() {
            Ok(p) if p > 0.0 && p <= 100.0 => Ok(HbmLimit::Share(p / 100.0)),
            _ => Err(format!("{text:?} is not a share of the GPU like 50% (more than 0, at most 100)")),
        }
    }

    /// The bytes it gives on a GPU of `total` bytes.
    pub fn of(self, total: usize) -> usize {
        match self {
            HbmLimit::Bytes(bytes) => bytes,
            HbmLimit::Share(share) => (total as f64 * share) as usize,
        }
    }
}

impl std::fmt::Display for HbmLimit {
    /// As [`HbmLimit::parse`] reads it back: bytes, or a percentage.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HbmLimit::Bytes(bytes) => write!(f, "{bytes}"),
            HbmLimit::Share(share) => write!(f, "{}%", share * 100.0),
        }
    }
}

/// Formats bytes for people: `1.50 GiB`.
pub fn format_size(bytes: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

/// A switch's value: on or off (also 1/0, true/false, yes/no).
fn on_or_off(name: &str, v: &str) -> Result<bool> {
    match v.trim() {
        "on" | "1" | "true" | "yes" => Ok(true),
        "off" | "0" | "false" | "no" => Ok(false),
        _ => Err(Error::Config(format!("{name}={v:?}: say on or off"))),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_hbm_limit_is_a_size_or_a_share_of_the_gpu() {
        use super::HbmLimit;
        assert_eq!(HbmLimit::parse("16GiB"), Ok(HbmLimit::Bytes(16 << 30)));
        assert_eq!(HbmLimit::parse(" 50% "), Ok(HbmLimit::Share(0.5)));
        assert_eq!(HbmLimit::parse("50%").map(|l| l.of(1 << 30)), Ok(512 << 20));
        assert_eq!(HbmLimit::parse("100%").map(|l| l.of(1000)), Ok(1000));
        for bad in ["0%", "150%", "-5%", "half%", "%", "lots"] {
            assert!(HbmLimit::parse(bad).is_err(), "{bad}");
        }
        for limit in [HbmLimit::Bytes(123), HbmLimit::Share(0.25), HbmLimit::Share(0.7)] {
            assert_eq!(HbmLimit::parse(&limit.to_string()), Ok(limit), "written as it is read");
        }
    }

    use super::*;

    #[test]
    fn sizes_parse_in_binary_units() {
        assert_eq!(parse_size("16GiB"), Ok(16 << 30));
        assert_eq!(parse_size("512 MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("2097152"), Ok(2 << 20));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("3 parsecs").is_err());
    }

    #[test]
    fn peer_choices_parse() {
        assert_eq!("auto".parse(), Ok(PeerChoice::Auto));
        assert_eq!(" OFF ".parse(), Ok(PeerChoice::Off));
        assert_eq!("1, 3".parse(), Ok(PeerChoice::Gpus(vec![1, 3])));
        assert!("1,x".parse::<PeerChoice>().is_err());
    }

    #[test]
    fn sizes_format_for_people() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(3 << 29), "1.50 GiB");
    }
}
