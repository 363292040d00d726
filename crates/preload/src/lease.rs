//! The node daemon's lease of a GPU's HBM to a program under `tiermem run`: with `tiermemd`
//! running, each GPU tiermem manages in the process is a tenant like any engine (crate
//! `tiermem-tenant`), its budget granted and changed by the daemon.
//!
//! At a GPU's first allocation or memory query ([`ensure`]), when `TIERMEM_DAEMON` names a
//! socket (`auto`, the default: the daemon's, if it exists), a link registers the GPU asking for
//! its standalone budget (`TIERMEM_HBM_LIMIT`, or the free memory less 2 GiB) and waits up to
//! two seconds for the first grant, so that the program starts within its share. Without a
//! daemon nothing changes.
//!
//! A grant sets the budget to the smaller of it and the standalone budget. A larger one is
//! used from the next quiesce point on (chunks come up as their heat asks). A smaller one is
//! met by the program's next quiesce point if it comes within `TIERMEM_SHED_GRACE_MS` (where
//! the step is planned again for it), else from the link's thread: the coldest chunks go down
//! in a pause of tiermem's own (`migrate::meet`), so an idle program, or one that never
//! synchronizes, gives memory back too; only then is the grant acknowledged. What cannot move (small allocations the driver
//! serves, a stream capture under way, a green context of the program's) leaves it unmet, said
//! on stderr, and the daemon's deadline marks the tenant late.
//!
//! With `tiermem run --peers` (spill.rs), neighbours' HBM is the tenant's peer tier: it asks
//! for what its lenders offered, reports what they lend it (and the host only what lies there),
//! and a `peer` budget, where the daemon shares that tier, bounds what they lend it together;
//! a cut is given back like a lender's shortfall (`migrate::meet_lent`).
//!
//! What the daemon sees: HBM held and allocated, host memory holding the chunks that do not
//! fit, the bytes moved up and down, the time spent at tiermem's pauses and quiesce points as
//! stall, and kernel launches as the tenant's acquires (a program that launches nothing is idle,
//! and the daemon lends its unused share to busy tenants).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use tiermem_protocol::{GpuId, Tier, TierBytes, TierUsage, TransferCounters};
use tiermem_tenant::{DaemonLink, Registration, Tenant, Usage};

use crate::placement;
use crate::process;

/// One managed GPU as the daemon's tenant.
struct GpuTenant {
    ordinal: usize,
}

/// A GPU's tenant and its link, kept for the process's life.
type Linked = (Arc<GpuTenant>, DaemonLink);

/// The links made so far, by GPU (`None`: the GPU runs standalone).
static LINKS: Mutex<BTreeMap<usize, Option<Linked>>> = Mutex::new(BTreeMap::new());

/// The GPUs (ordinals below 64) [`ensure`] has seen: every allocation asks, with one atomic read.
static SEEN: AtomicU64 = AtomicU64::new(0);

/// Links GPU `ordinal` to the daemon at its first use, if one runs (module documentation).
pub fn ensure(call: &str, ordinal: usize) {
    let bit = 1u64.checked_shl(ordinal as u32).unwrap_or(0);
    if SEEN.load(Relaxed) & bit != 0 {
        return;
    }
    let mut links = LINKS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if links.contains_key(&ordinal) {
        return;
    }
    let managed = process::lock().gpu(call, ordinal).device.is_some();
    let socket = managed.then(|| tiermem_tenant::DaemonSetting::from_env().socket()).flatten();
    let link = socket.and_then(|_| {
        let tenant = Arc::new(GpuTenant { ordinal });
        tiermem_tenant::attach_from_env(&tenant).map(|link| (tenant, link))
    });
    if link.is_some() {
        // The daemon may cut the budget at any moment: keep a recorded cycle to plan it by.
        crate::hotness::scan_always();
    }
    links.insert(ordinal, link);
    SEEN.fetch_or(bit, Relaxed);
}

/// One `--stats` line per GPU linked to the daemon: its tenant id, and its budget now.
pub fn report() -> Vec<String> {
    let links = LINKS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let linked = links.iter().filter_map(|(&ordinal, link)| Some((ordinal, link.as_ref()?)));
    linked
        .map(|(ordinal, (_, link))| {
            let state = link.state();
            let budget = process::budget_and_use(ordinal).map_or(0, |(budget, _)| budget);
            let (waits, seconds) = crate::turns::waited();
            format!(
                "tiermem: stats: GPU {ordinal} leased from tiermemd (tenant {}, {} session(s), {} budget(s) applied): budget {} at exit; launches waited for turns {waits} time(s), {seconds:.1} s",
                state.tenant.map_or("-".into(), |t| t.to_string()),
                state.sessions,
                state.budgets_applied,
                tiermem::format_size(budget),
            )
        })
        .collect()
}

impl Tenant for GpuTenant {
    fn registration(&self) -> Registration {
        let p = process::lock();
        let gpu = p.gpus.get(&self.ordinal);
        let info = gpu.and_then(|gpu| gpu.device.as_ref()).map(|device| device.info().clone());
        let (limit, used, chunk) = gpu.map_or((0, 0, 0), |gpu| (gpu.limit, gpu.hbm_used, gpu.chunk));
        drop(p);
        let (lent, offered) = crate::spill::borrowed(self.ordinal);
        let mut wants = vec![TierBytes { tier: Tier::Hbm, bytes: limit as u64 }];
        let mut held = vec![TierBytes { tier: Tier::Hbm, bytes: used as u64 }];
        if offered > 0 {
            wants.push(TierBytes { tier: Tier::Peer, bytes: offered as u64 });
            held.push(TierBytes { tier: Tier::Peer, bytes: lent as u64 });
        }
        Registration {
            gpu: GpuId {
                index: self.ordinal as u32,
                uuid: info.as_ref().and_then(|info| info.uuid.clone()),
                total_bytes: info.map_or(0, |info| info.total_bytes as u64),
                simulated: false,
            },
            chunk_bytes: chunk as u64,
            wants,
            held,
            lent_slab_bytes: None,
            // Its launches can be held (turns.rs), unless `TIERMEM_WAIT_FOR_TURNS=off`.
            waits: crate::turns::enabled(),
        }
    }

    fn usage(&self) -> Usage {
        let (hbm_used, budget, allocated, beyond) = {
            let p = process::lock();
            let (used, budget) = p.gpus.get(&self.ordinal).map_or((0, 0), |gpu| (gpu.hbm_used, gpu.budget));
            let mine = || p.books.iter().filter(|a| a.ordinal == self.ordinal);
            let beyond: usize = mine().map(|a| a.bytes_on(placement::Tier::Host)).sum();
            let allocated: usize = mine().map(|a| a.bytes_on(placement::Tier::Hbm)).sum::<usize>() + beyond;
            (used as u64, budget as u64, allocated as u64, beyond as u64)
        };
        // Beyond the budget is the host's, less what neighbours lend (spares included); what
        // the tenant would borrow: all that does not fit its HBM, up to what they offered.
        let (lent, offered) = crate::spill::borrowed(self.ordinal);
        let (lent, offered) = (lent as u64, offered as u64);
        let on_host = beyond.saturating_sub(lent);
        let hbm = TierUsage { used: hbm_used, acquired: 0, demand: allocated.max(hbm_used), reserved: 0 };
        let borrowable = allocated.saturating_sub(budget).min(offered);
        let peer = TierUsage { used: lent, acquired: 0, demand: borrowable.max(lent), reserved: 0 };
        let host = TierUsage { used: on_host, acquired: 0, demand: on_host, reserved: 0 };
        let migration = crate::migrate::counters();
        let (bytes_in, bytes_out) = crate::rounds::bytes_moved();
        let transfers = TransferCounters {
            bytes_in,
            bytes_out,
            evictions: migration.down,
            stall_us: (migration.nanos + migration.pause_nanos) / 1000,
            acquires: migration.launches_scanned,
            largest_acquire_bytes: 0,
            launches: migration.launches_scanned,
            launches_all_in_hbm: migration.launches_all_in_hbm,
        };
        ([hbm, peer, host, TierUsage::default()], transfers)
    }

    fn wait_for_turn(&self, wait: bool) {
        crate::turns::set(self.ordinal, wait);
    }

    fn others_wait(&self, others_wait: bool) {
        crate::spares::others_wait(self.ordinal, others_wait);
    }

    /// Host chunks made ahead of a cut, if asked for (spares.rs).
    fn ready_for_cuts(&self) {
        let _ = std::panic::catch_unwind(|| crate::spares::make_ahead(self.ordinal));
    }

    fn meet_budget(&self, tier: Tier, bytes: u64) -> Result<(), String> {
        match tier {
            Tier::Hbm => {}
            Tier::Peer => {
                let _inside = crate::boundary::enter();
                crate::spill::set_budget(self.ordinal, usize::try_from(bytes).unwrap_or(usize::MAX));
                crate::trace::event("peer_budget", || format!("\"gpu\": {}, \"bytes\": {bytes}", self.ordinal));
                return crate::migrate::meet_lent("tiermemd peer budget", self.ordinal);
            }
            // Host chunks are pinned one by one as they are made: no pool to cap.
            _ => return Ok(()),
        }
        // This thread is tiermem's own: its driver calls reach the driver, not the wrappers
        // (whose gate the shedding holds).
        let _inside = crate::boundary::enter();
        {
            let mut p = process::lock();
            let Some(gpu) = p.gpus.get_mut(&self.ordinal) else { return Ok(()) };
            gpu.budget = gpu.limit.min(usize::try_from(bytes).unwrap_or(usize::MAX));
            let (budget, used) = (gpu.budget, gpu.hbm_used);
            crate::trace::event("budget", || {
                format!("\"gpu\": {}, \"bytes\": {budget}, \"hbm_used\": {used}", self.ordinal)
            });
        }
        crate::migrate::meet("tiermemd budget", self.ordinal)
    }
}

/// HBM left to others when no budget is given: the default budget is the GPU's free memory,
/// when tiermem first sees it, less this (as the engine's `hbm_reserve`).
const DEFAULT_RESERVE: usize = 2 << 30;

/// The budget of a GPU with `free` of its `total` bytes free: `TIERMEM_HBM_LIMIT` (`16GiB`, `50%`).
pub fn standalone_budget(call: &str, free: usize, total: usize) -> usize {
    let default = free.saturating_sub(DEFAULT_RESERVE);
    match std::env::var("TIERMEM_HBM_LIMIT") {
        Err(_) => default,
        // More than the GPU has is refused: `cuMemGetInfo` would report a GPU larger than it is.
        Ok(text) => tiermem::HbmLimit::parse(&text)
            .map(|limit| limit.of(total))
            .and_then(|bytes| {
                let too_much = || {
                    format!("{} is more than the GPU's {}", tiermem::format_size(bytes), tiermem::format_size(total))
                };
                (bytes <= total).then_some(bytes).ok_or_else(too_much)
            })
            .unwrap_or_else(|why| {
                crate::boundary::log(
                    call,
                    &format!("TIERMEM_HBM_LIMIT: {why}"),
                    "using the GPU's free memory less 2 GiB instead",
                );
                default
            }),
    }
}
