//! The stores a server can serve and what it asks of them beyond [`Blocks`]
//! ([`StoreControl`]: report, limits, cap): the engine's [`VramStore`], or host memory
//! ([`MemBlocks`]) for tests.

use super::{ServeConfig, StoreKind};
use crate::control::StoreReport;
use crate::mem_blocks::MemBlocks;
use crate::{Applied, Blocks, Limits, StoreConfig, VramStore};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tiermem_tenant::{DaemonLink, Leaseholder};

/// What the server asks of a store beyond [`Blocks`]: its report, its limits, a forced cap.
pub trait StoreControl: Send + Sync {
    fn report(&self) -> StoreReport;
    /// Changes the limits given (`None`: unchanged): the free VRAM below which the store takes
    /// no more (soft) and gives back (hard).
    fn set_limits(&self, soft: Option<u64>, hard: Option<u64>) -> Result<(), String>;
    /// Forces HBM down to `cap` (`None`: lifts it) and returns when it is met, with
    /// `cap_bytes`, `seconds` (taken), `moved_bytes` and `hbm_bytes` (held after).
    fn set_cap(&self, cap: Option<u64>) -> Result<Value, String>;
}

/// A store and its control.
pub struct OpenedStore {
    pub blocks: Arc<dyn Blocks>,
    pub control: Arc<dyn StoreControl>,
}

/// The limits a server starts with: those given, the store's defaults for the others, the
/// hard one never above the soft one.
pub fn limits_for(soft: Option<u64>, hard: Option<u64>) -> Result<Limits, String> {
    let default = Limits::default();
    let limits = Limits {
        soft_free: soft.unwrap_or(default.soft_free.max(hard.unwrap_or(0))),
        hard_free: hard.unwrap_or(default.hard_free.min(soft.unwrap_or(u64::MAX))),
        ..default
    };
    limits.check()?;
    Ok(limits)
}

/// Opens the store the server serves: `size` bytes (the devices' total).
pub fn open_store(config: &ServeConfig, size: u64) -> Result<OpenedStore, String> {
    match config.store {
        StoreKind::Memory => Ok(memory_store(config, size)),
        StoreKind::Engine => {
            let spill = (config.spill_size > 0).then(|| config.spill.clone());
            let mut store_config = StoreConfig::new(size, spill);
            store_config.engine.device = config.gpu;
            store_config.engine.file_limit = if config.spill_size > 0 { config.spill_size as usize } else { 0 };
            // TIERMEM_BACKEND=cuda insists on the GPU, =sim asks for the simulated device.
            if let Some(backend) = std::env::var("TIERMEM_BACKEND").ok().filter(|v| !v.trim().is_empty()) {
                store_config.engine.backend = backend.parse().map_err(|e| format!("TIERMEM_BACKEND={backend}: {e}"))?;
            }
            store_config.limits = limits_for(config.soft_limit, config.hard_limit)?;
            let store = Arc::new(VramStore::open(store_config).map_err(|e| e.to_string())?);
            let engine = store.engine();
            let info = engine.device_info();
            let backend = match (info.backend, engine.fallback_reason()) {
                (tiermem::mechanism::BackendKind::Cuda, _) => format!(
                    "CUDA GPU {} ({}, {}), chunks of {}",
                    info.ordinal,
                    info.name,
                    tiermem::format_size(info.total_bytes),
                    tiermem::format_size(engine.chunk_size())
                ),
                (_, why) => format!(
                    "the simulated device (host memory standing in for VRAM: tests only, never swap to it){}",
                    why.map(|why| format!(", because {why}")).unwrap_or_else(|| " (TIERMEM_BACKEND=sim)".into())
                ),
            };
            let caps = Arc::new(Caps { store: store.clone(), set: Mutex::new((None, None)) });
            // TIERMEM_DAEMON: the node daemon, when it runs, leases this device's HBM too.
            let daemon = tiermem_tenant::attach_from_env(&caps);
            let control = Arc::new(EngineControl { caps, backend, daemon });
            Ok(OpenedStore { blocks: store, control })
        }
    }
}

/// The two caps on the store's HBM — forced by `tiermem swap cap`, granted by the node daemon
/// (`tiermem-tenant` leases through [`Leaseholder`]) — of which the store holds the smaller.
struct Caps {
    store: Arc<VramStore>,
    /// (forced, granted); held while a cap is applied, so the two never race.
    set: Mutex<(Option<u64>, Option<u64>)>,
}

impl Caps {
    fn apply(&self, change: impl FnOnce(&mut (Option<u64>, Option<u64>))) -> Result<Applied, String> {
        let mut set = self.set.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        change(&mut set);
        let cap = match *set {
            (Some(forced), Some(granted)) => Some(forced.min(granted)),
            (forced, granted) => forced.or(granted),
        };
        self.store.set_external_cap(cap).map_err(|e| e.to_string())
    }
}

impl Leaseholder for Caps {
    fn engine(&self) -> &tiermem::Engine {
        self.store.engine()
    }

    /// The whole device in HBM, if the daemon can spare it.
    fn wants_hbm(&self) -> u64 {
        self.store.size()
    }

    fn meet_hbm_budget(&self, bytes: u64) -> Result<(), String> {
        self.apply(|set| set.1 = Some(bytes)).map(|_| ())
    }
}

/// [`StoreControl`] for the engine's [`VramStore`].
struct EngineControl {
    caps: Arc<Caps>,
    backend: String,
    /// The lease from the node daemon, while it runs (ends with the store).
    daemon: Option<DaemonLink>,
}

impl StoreControl for EngineControl {
    fn report(&self) -> StoreReport {
        let stats = self.caps.store.stats();
        StoreReport {
            backend: self.backend.clone(),
            size_bytes: stats.size,
            present_bytes: stats.bytes_present,
            hbm_bytes: stats.hbm_bytes,
            host_bytes: stats.host_bytes,
            file_bytes: stats.file_bytes,
            soft_limit_bytes: Some(stats.limits.soft_free),
            hard_limit_bytes: Some(stats.limits.hard_free),
            cap_bytes: stats.external_cap,
            give_backs: stats.give_backs.count,
            given_back_bytes: stats.give_backs.bytes,
            detail: serde_json::to_value(&stats).unwrap_or(Value::Null),
            daemon: self.daemon.as_ref().map(|link| {
                let state = link.state();
                json!({"connected": state.connected, "tenant": state.tenant, "budget_bytes": state.budget})
            }),
        }
    }

    fn set_limits(&self, soft: Option<u64>, hard: Option<u64>) -> Result<(), String> {
        let mut limits = self.caps.store.stats().limits;
        limits.soft_free = soft.unwrap_or(limits.soft_free);
        limits.hard_free = hard.unwrap_or(limits.hard_free);
        limits.check()?;
        self.caps.store.set_limits(limits).map(|_| ()).map_err(|e| e.to_string())
    }

    fn set_cap(&self, cap: Option<u64>) -> Result<Value, String> {
        let started = Instant::now();
        let applied = self.caps.apply(|set| set.0 = cap)?;
        let seconds = started.elapsed().as_secs_f64();
        let give_back = applied.give_back;
        Ok(json!({
            "cap_bytes": cap,
            "seconds": give_back.map_or(seconds, |g| g.seconds),
            "moved_bytes": give_back.map_or(0, |g| g.bytes()),
            "hbm_bytes": self.caps.store.hbm_held(),
            "budget_bytes": applied.decision.budget,
            "give_back": give_back,
        }))
    }
}

fn memory_store(config: &ServeConfig, size: u64) -> OpenedStore {
    let blocks = Arc::new(MemBlocks::new(size));
    let limits = (config.soft_limit, config.hard_limit);
    let control = Arc::new(MemControl { blocks: blocks.clone(), limits: Mutex::new((limits.0, limits.1, None)) });
    OpenedStore { blocks, control }
}

/// [`StoreControl`] for [`MemBlocks`]: it holds no HBM, so limits and caps are met at once.
struct MemControl {
    blocks: Arc<MemBlocks>,
    limits: Mutex<(Option<u64>, Option<u64>, Option<u64>)>,
}

impl StoreControl for MemControl {
    fn report(&self) -> StoreReport {
        let (soft, hard, cap) = *self.limits.lock().unwrap();
        StoreReport {
            backend: "host memory (tests only: not VRAM, never swap to it)".into(),
            size_bytes: self.blocks.size(),
            present_bytes: self.blocks.present_bytes(),
            host_bytes: self.blocks.present_bytes(),
            soft_limit_bytes: soft,
            hard_limit_bytes: hard,
            cap_bytes: cap,
            ..Default::default()
        }
    }

    fn set_limits(&self, soft: Option<u64>, hard: Option<u64>) -> Result<(), String> {
        let mut limits = self.limits.lock().unwrap();
        let (soft, hard) = (soft.or(limits.0), hard.or(limits.1));
        if let (Some(soft), Some(hard)) = (soft, hard) {
            if hard > soft {
                return Err(format!("the hard limit ({hard} bytes free) must not exceed the soft limit ({soft})"));
            }
        }
        (limits.0, limits.1) = (soft, hard);
        Ok(())
    }

    fn set_cap(&self, cap: Option<u64>) -> Result<Value, String> {
        self.limits.lock().unwrap().2 = cap;
        Ok(json!({"cap_bytes": cap, "seconds": 0.0, "moved_bytes": 0, "hbm_bytes": 0}))
    }
}
