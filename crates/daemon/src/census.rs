//! Accounting that adds up: a GPU's memory as the driver counts it, set against the chunks
//! the tenants report.
//!
//! A tenant's budget covers its engine's chunks only. Its process holds more of the GPU: the
//! CUDA context, the libraries' workspaces (cuBLAS, NCCL), allocations made outside tiermem
//! (PyTorch's own caching allocator). Other processes, not tenants at all, hold some too. A
//! daemon that shared out the GPU's size less a fixed reserve would promise memory that is
//! not there once these grow, and the last tenant to page in would fail where the driver
//! says the GPU is full.
//!
//! So every half second the server takes a *census* of each GPU with tenants (NVML: the
//! GPU's size, what is used, what each process holds; server.rs) and this ledger turns it
//! into what the tenants' chunks may take together:
//!
//! ```text
//! capacity = total − others − Σ overhead(pid) − margin
//! overhead(pid) = what NVML says the process holds − the chunks its tenants report holding
//! ```
//!
//! `others` is what processes that are not tenants hold. A process's overhead is the median
//! of its last [`SAMPLES`] censuses: a tenant's report lags its chunks by up to 50 ms, so one
//! census taken mid-page-in would count chunks as overhead, and a capacity that dipped with
//! it would make every tenant evict for nothing; for the same reason the capacity moves only
//! by [`STEADY`] or more (well within the margin). The registry takes the smaller of this and
//! the configured capacity (registry.rs, `pools`), and `tiermem status` shows every term.
//! Where this count, not the configured capacity, is what limits the chunks, the registry
//! then charges each tenant its own process's overhead: the pool is shared out with every
//! overhead added back, each tenant claiming its overhead on top of its chunks, and the
//! overhead is taken from that tenant's budget (registry.rs, `rebalance`), so one process's
//! large context or workspace shrinks its own budget, not its neighbours'. A charge (and
//! with it the capacity) moves only when the overhead moves by [`STEADY`] or more.
//!
//! NVML names processes as the host's pid namespace does, the daemon its tenants as its own
//! namespace does (`SO_PEERCRED`). Where they differ (a daemon in a container without the
//! host's pids) a tenant's process is missing from the census; then nothing is derived from
//! it (the whole of that process would otherwise count as someone else's), the configured
//! capacity stands, and the status says why.

use std::collections::{BTreeMap, VecDeque};
use tiermem_protocol::DriverAccounts;

/// Censuses a process's overhead is the median of.
pub const SAMPLES: usize = 5;

/// Left free of a GPU's counted capacity, for what grows between two censuses.
pub const MARGIN: u64 = 256 << 20;

/// The counted capacity changes only by at least this much (well within [`MARGIN`]): an
/// overhead wandering by a few MiB does not send every tenant a new budget each census.
pub const STEADY: u64 = 64 << 20;

/// One GPU's memory as the driver counts it: its size, what is used, and what each process
/// holds (`None`: NVML does not say).
pub use tiermem::mechanism::cuda::nvml::Census;

/// What the last censuses of one GPU came to.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    total: u64,
    used: u64,
    others: u64,
    /// Per tenant process: its recent overheads, newest last.
    overheads: BTreeMap<u32, VecDeque<u64>>,
    /// Why the census cannot be used, if it cannot.
    unusable: Option<String>,
    /// The capacity last adopted (before the margin), changed only by [`STEADY`] or more.
    adopted: Option<u64>,
    /// Per tenant process: the overhead last adopted (what it is charged, registry.rs),
    /// changed only when its median moves by [`STEADY`] or more.
    charged: BTreeMap<u32, u64>,
}

impl Ledger {
    /// Takes a census; `tenants` are the tenant processes on this GPU, each with the chunk
    /// bytes its tenants report holding in its HBM.
    pub fn record(&mut self, census: &Census, tenants: &BTreeMap<u32, u64>) {
        self.total = census.total;
        self.used = census.used;
        let held = |pid: u32| census.processes.iter().find(|&&(p, _)| p == pid).map(|&(_, bytes)| bytes);
        let missing: Vec<u32> = tenants.keys().copied().filter(|&pid| held(pid).is_none()).collect();
        let unreported = census.processes.iter().filter(|(_, bytes)| bytes.is_none()).count();
        self.unusable = match (missing.is_empty(), unreported) {
            (false, _) => Some(format!(
                "tenant process(es) {missing:?} not in NVML's list for this GPU: run the daemon in the host's pid \
                 namespace (hostPID in Kubernetes); capacity as configured"
            )),
            (true, n) if n > 0 => Some(format!("NVML does not say what {n} process(es) hold: capacity as configured")),
            (true, _) => None,
        };
        self.overheads.retain(|pid, _| tenants.contains_key(pid));
        self.charged.retain(|pid, _| tenants.contains_key(pid));
        if self.unusable.is_some() {
            return;
        }
        self.others = census
            .processes
            .iter()
            .filter(|(pid, _)| !tenants.contains_key(pid))
            .map(|&(_, bytes)| bytes.unwrap_or(0))
            .sum();
        for (&pid, &chunks) in tenants {
            let process = held(pid).flatten().unwrap_or(0);
            let samples = self.overheads.entry(pid).or_default();
            samples.push_back(process.saturating_sub(chunks));
            if samples.len() > SAMPLES {
                samples.pop_front();
            }
        }
        for &pid in tenants.keys() {
            let median = self.overhead(pid).unwrap_or(0);
            let charged = self.charged.entry(pid).or_insert(median);
            if charged.abs_diff(median) >= STEADY {
                *charged = median;
            }
        }
        let counted = self.total.saturating_sub(self.others).saturating_sub(self.charged.values().sum());
        if self.adopted.is_none_or(|adopted| adopted.abs_diff(counted) >= STEADY) {
            self.adopted = Some(counted);
        }
    }

    /// The overhead tenant process `pid` is charged (registry.rs): its median overhead as last
    /// adopted, which moves only by [`STEADY`] or more, so that an overhead wandering by a few
    /// MiB does not move every tenant's budget each census.
    pub fn charge(&self, pid: u32) -> Option<u64> {
        match &self.unusable {
            Some(_) => None,
            None => self.charged.get(&pid).copied(),
        }
    }

    /// The overhead of tenant process `pid` (median of its recent censuses).
    pub fn overhead(&self, pid: u32) -> Option<u64> {
        let samples = self.overheads.get(&pid)?;
        let mut sorted: Vec<u64> = samples.iter().copied().collect();
        sorted.sort_unstable();
        sorted.get(sorted.len() / 2).copied()
    }

    /// What the tenants' chunks may take together, `margin` left free for what grows between
    /// censuses; `None` when the census cannot be used (or none was taken).
    pub fn capacity(&self, margin: u64) -> Option<u64> {
        match &self.unusable {
            Some(_) => None,
            None => self.adopted.map(|c| c.saturating_sub(margin)),
        }
    }

    /// What tenant processes hold beyond their chunks, all together.
    fn overhead_sum(&self) -> u64 {
        self.overheads.keys().filter_map(|&pid| self.overhead(pid)).sum()
    }

    /// The ledger's terms, as the status shows them.
    pub fn accounts(&self) -> DriverAccounts {
        DriverAccounts {
            total: self.total,
            used: self.used,
            others: self.others,
            overhead: self.overhead_sum(),
            note: self.unusable.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    fn census(processes: &[(u32, u64)]) -> Census {
        let used = processes.iter().map(|p| p.1).sum();
        Census { total: 80 * GIB, used, processes: processes.iter().map(|&(p, b)| (p, Some(b))).collect() }
    }

    #[test]
    fn capacity_is_the_gpu_less_other_processes_and_each_tenant_process_beyond_its_chunks() {
        let mut ledger = Ledger::default();
        // Tenant 10 holds 20 GiB of chunks in a process of 20.5 GiB; 11 holds 8 GiB in 9 GiB;
        // process 99 is no tenant and holds 6 GiB.
        let tenants = BTreeMap::from([(10, 20 * GIB), (11, 8 * GIB)]);
        ledger.record(&census(&[(10, 20 * GIB + 512 * MIB), (11, 9 * GIB), (99, 6 * GIB)]), &tenants);
        assert_eq!(ledger.overhead(10), Some(512 * MIB));
        assert_eq!(ledger.overhead(11), Some(GIB));
        assert_eq!(ledger.capacity(256 * MIB), Some(80 * GIB - 6 * GIB - 512 * MIB - GIB - 256 * MIB));
        let accounts = ledger.accounts();
        assert_eq!(
            (accounts.others, accounts.overhead, accounts.used),
            (6 * GIB, GIB + 512 * MIB, 35 * GIB + 512 * MIB)
        );
        // The chunks, the overheads and the others add up to what the driver says is used.
        assert_eq!(28 * GIB + accounts.overhead + accounts.others, accounts.used);
    }

    #[test]
    fn one_census_taken_mid_page_in_does_not_move_the_overhead() {
        let mut ledger = Ledger::default();
        let tenants = BTreeMap::from([(10, 4 * GIB)]);
        for _ in 0..3 {
            ledger.record(&census(&[(10, 4 * GIB + 500 * MIB)]), &tenants);
        }
        // The process paged in 2 GiB that its report does not show yet.
        ledger.record(&census(&[(10, 6 * GIB + 500 * MIB)]), &tenants);
        assert_eq!(ledger.overhead(10), Some(500 * MIB));
        // An overhead that stays grows within SAMPLES censuses (PyTorch allocating beside tiermem).
        for _ in 0..SAMPLES {
            ledger.record(&census(&[(10, 7 * GIB)]), &tenants);
        }
        assert_eq!(ledger.overhead(10), Some(3 * GIB));
    }

    #[test]
    fn a_tenant_missing_from_the_census_or_an_unreported_process_leaves_the_capacity_configured() {
        let mut ledger = Ledger::default();
        ledger.record(&census(&[(500, 10 * GIB)]), &BTreeMap::from([(10, 4 * GIB)]));
        assert_eq!(ledger.capacity(0), None);
        assert!(ledger.accounts().note.unwrap().contains("pid namespace"));
        let unreported = Census { total: 80 * GIB, used: GIB, processes: vec![(10, Some(GIB)), (7, None)] };
        ledger.record(&unreported, &BTreeMap::from([(10, 0)]));
        assert_eq!(ledger.capacity(0), None);
        // Once the census can be used again, the capacity follows it.
        ledger.record(&census(&[(10, GIB)]), &BTreeMap::from([(10, 0)]));
        assert_eq!(ledger.capacity(0), Some(79 * GIB));
    }

    #[test]
    fn the_capacity_moves_only_by_a_steady_step() {
        let mut ledger = Ledger::default();
        let tenants = BTreeMap::from([(10, 0)]);
        ledger.record(&census(&[(10, GIB), (99, GIB)]), &tenants);
        assert_eq!(ledger.capacity(0), Some(78 * GIB));
        // The other process grows by 10 MiB: no new capacity; by STEADY: a new one.
        ledger.record(&census(&[(10, GIB), (99, GIB + 10 * MIB)]), &tenants);
        assert_eq!(ledger.capacity(0), Some(78 * GIB));
        ledger.record(&census(&[(10, GIB), (99, GIB + STEADY)]), &tenants);
        assert_eq!(ledger.capacity(0), Some(78 * GIB - STEADY));
    }

    #[test]
    fn a_tenant_process_that_left_takes_its_overhead_with_it() {
        let mut ledger = Ledger::default();
        ledger.record(&census(&[(10, GIB), (11, GIB)]), &BTreeMap::from([(10, 0), (11, 0)]));
        assert_eq!(ledger.capacity(0), Some(78 * GIB));
        ledger.record(&census(&[(10, GIB)]), &BTreeMap::from([(10, 0)]));
        assert_eq!((ledger.overhead(11), ledger.capacity(0)), (None, Some(79 * GIB)));
    }
}
