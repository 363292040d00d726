//! The messages, in both directions. Every size is in bytes. `docs/protocol.md` shows each one
//! as it travels (JSON, tagged by `"type"`).

use serde::{Deserialize, Serialize};

/// The version this build speaks. A peer with another version is refused at `hello`/`welcome`
/// ([`crate::ProtocolError::VersionMismatch`]); the number changes with any change that an
/// older peer would misread.
pub const PROTOCOL_VERSION: u32 = 1;

/// A tenant sends its [`ClientMessage::Usage`] when it changes and, unchanged, at least this
/// often: so the daemon tells a tenant that stopped acquiring (its reports come, its acquire
/// count still) from one it has not heard from (busy meeting a cut, stalled), which it never
/// takes for idle.
pub const USAGE_HEARTBEAT: std::time::Duration = std::time::Duration::from_millis(200);

/// A tier of memory a budget is given for (the engine's and the policies' own).
pub use tiermem_policy::Tier;

/// The GPU a tenant's engine runs on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuId {
    /// The device ordinal (CUDA index).
    pub index: u32,
    /// The GPU's UUID, when the driver gives one.
    pub uuid: Option<String>,
    /// The GPU's memory: the daemon's default capacity for it is this less a reserve.
    pub total_bytes: u64,
    /// The simulated device (tests, machines without a GPU).
    pub simulated: bool,
}

/// Bytes of one tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierBytes {
    pub tier: Tier,
    pub bytes: u64,
}

/// A tenant's use of one tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TierUsage {
    /// Bytes held now.
    pub used: u64,
    /// Bytes held acquired: they cannot be taken away (the floor of its share).
    pub acquired: u64,
    /// Bytes it would hold if it could (its allocations).
    pub demand: u64,
    /// Bytes it holds beyond `used`, ready and not in use: host memory pinned ahead for the
    /// evictions a budget cut will make (`TIERMEM_EVICT_ROOM`). Shown, not shared out.
    #[serde(default)]
    pub reserved: u64,
}

/// A tenant engine's transfer counters since it started (for the daemon's metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TransferCounters {
    /// Bytes copied into HBM, and out of it.
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Chunks evicted by the engine's policy.
    pub evictions: u64,
    /// Device time that acquiring streams waited on demand copies, in microseconds.
    pub stall_us: u64,
    /// Acquires so far: a tenant whose count stays put is idle (docs/daemon.md, "Idle tenants").
    #[serde(default)]
    pub acquires: u64,
    /// The most bytes one acquire has held: an idle tenant keeps at least this much, so that
    /// its next acquire can go through before its budget grows back.
    #[serde(default)]
    pub largest_acquire_bytes: u64,
    /// Kernel launches seen, and those whose pointer arguments were all in HBM (a program under
    /// `tiermem run`; 0 for an engine, which sees no launches).
    #[serde(default)]
    pub launches: u64,
    #[serde(default)]
    pub launches_all_in_hbm: u64,
}

/// One tier's budget for a tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierBudget {
    pub tier: Tier,
    /// The bytes it may hold from now on.
    pub bytes: u64,
    /// Its fair share, which `bytes` reaches once other tenants have given memory back.
    pub target: u64,
}

/// Tenant (or `tiermem status`) → daemon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ClientMessage {
    /// Always first.
    Hello { version: u32, client: String },
    /// Makes this connection a tenant: one engine on one GPU.
    Register {
        pid: u32,
        /// A name the configuration may match (`TIERMEM_LABEL`).
        label: Option<String>,
        gpu: GpuId,
        /// The engine's chunk: budgets are whole chunks.
        chunk_bytes: u64,
        /// The caps the engine would use alone (its own limits): never exceeded.
        wants: Vec<TierBytes>,
        /// What it holds already (a tenant reconnecting to a restarted daemon keeps its budget
        /// meanwhile): nothing is granted to others out of it until it gives it back.
        #[serde(default)]
        held: Vec<TierBytes>,
        /// The tenant borrows HBM that lenders on neighbour GPUs export ([`DaemonMessage::Lent`]),
        /// in slabs of this many bytes (its peer tier's slab); `None`: it does not.
        #[serde(default)]
        lent_slab_bytes: Option<u64>,
        /// The tenant can wait for its turn: told to ([`DaemonMessage::Budget`]'s `wait`), it
        /// starts no GPU work until a budget without it comes (a program under `tiermem run`,
        /// whose kernel launches tiermem holds). An engine cannot: it never sets this.
        #[serde(default)]
        waits: bool,
        /// The `tiermem run` the tenant's process runs under (the pid it hands its programs in
        /// `TIERMEM_RUN_PID`), if any: processes of one job may wait on each other, so the
        /// daemon's automatic turns (`hbm_sharing = "auto"`) never set them against each other.
        #[serde(default)]
        job: Option<u32>,
    },
    /// Makes this connection a lender (`tiermem lend`): a process holding a GPU's spare HBM
    /// that it exports, slab by slab, to tenants on other GPUs.
    Lend {
        pid: u32,
        gpu: GpuId,
        /// The most it lends, all borrowers together.
        offer_bytes: u64,
    },
    /// A lender's new offer; below what is lent, borrowers are asked to return the difference.
    Offer { bytes: u64 },
    /// A lender's answer to [`DaemonMessage::MakeSlabs`]: the slabs made, each exported as a
    /// file descriptor sent with this frame, in order; those it could not make (`error` says why).
    Slabs {
        ids: Vec<u64>,
        #[serde(default)]
        failed: Vec<u64>,
        error: Option<String>,
    },
    /// A borrower has unmapped and released these lent slabs (asked by [`DaemonMessage::Return`]
    /// or not): their memory is the lender's again.
    Returned { ids: Vec<u64> },
    /// What the tenant holds, per tier; sent when it changes (at most every ~50 ms) and at least
    /// every [`USAGE_HEARTBEAT`].
    Usage {
        hbm: TierUsage,
        host: TierUsage,
        file: TierUsage,
        /// HBM borrowed from neighbour GPUs (the peer tier), all lenders together.
        #[serde(default)]
        peer: TierUsage,
        #[serde(default)]
        transfers: TransferCounters,
    },
    /// The budget `seq` is met (what exceeded it has left the tier).
    BudgetMet { seq: u64 },
    /// Asks for a [`DaemonMessage::Status`].
    StatusRequest,
}

impl ClientMessage {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Hello { .. } => "hello",
            Self::Register { .. } => "register",
            Self::Usage { .. } => "usage",
            Self::BudgetMet { .. } => "budget_met",
            Self::StatusRequest => "status_request",
            Self::Lend { .. } => "lend",
            Self::Offer { .. } => "offer",
            Self::Slabs { .. } => "slabs",
            Self::Returned { .. } => "returned",
        }
    }
}

/// Why the daemon refused something; after an error it closes the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    VersionMismatch,
    Malformed,
    TooLarge,
    OutOfOrder,
    Refused,
    Internal,
}

/// Daemon → tenant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum DaemonMessage {
    /// The answer to `hello`.
    Welcome {
        version: u32,
        daemon: String,
    },
    /// The answer to `register`: the tenant's id and the configured tenant it matched.
    Registered {
        tenant: u64,
        name: String,
    },
    /// New budgets. Smaller ones are to be met (excess evicted) within `deadline_ms`, then
    /// acknowledged with `budget_met`.
    Budget {
        seq: u64,
        tiers: Vec<TierBudget>,
        deadline_ms: u64,
        /// To a tenant that registered `waits`, while its GPU's tenants take turns: start no
        /// GPU work until a budget without it (another tenant's whole working set has the GPU,
        /// or is still making room for this one's). Sent only when true.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        wait: bool,
        /// To a tenant that registered `waits`, in the second half of a turn of its whole
        /// working set that runs out (`turn_ms` above zero): another tenant waits for the GPU,
        /// so this one will be cut to its keep when its turn ends; it may make ready to give
        /// its memory back (a program under `tiermem run` makes host chunks to send its chunks
        /// into). Sent only when true.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        others_wait: bool,
    },
    Status(StatusReport),
    Error {
        kind: ErrorKind,
        message: String,
    },
    /// To a lender: make these slabs (`slab_bytes` each) and send them back exported
    /// ([`ClientMessage::Slabs`]).
    MakeSlabs {
        ids: Vec<u64>,
        slab_bytes: u64,
    },
    /// To a tenant: slabs of GPU `gpu`'s HBM lent to it, each a file descriptor sent with this
    /// frame, in order. It maps them into its peer tier.
    Lent {
        gpu: u32,
        slab_bytes: u64,
        ids: Vec<u64>,
    },
    /// To a tenant: give these lent slabs back within `deadline_ms` (move what they hold
    /// elsewhere, unmap, release, then [`ClientMessage::Returned`]); a tenant that does not is
    /// escalated (docs/daemon.md, "Borrowing neighbours' HBM").
    Return {
        ids: Vec<u64>,
        deadline_ms: u64,
    },
    /// To a lender: no borrower maps these slabs any more; release them.
    Release {
        ids: Vec<u64>,
    },
}

impl DaemonMessage {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Welcome { .. } => "welcome",
            Self::Registered { .. } => "registered",
            Self::Budget { .. } => "budget",
            Self::Status(_) => "status",
            Self::Error { .. } => "error",
            Self::MakeSlabs { .. } => "make_slabs",
            Self::Lent { .. } => "lent",
            Self::Return { .. } => "return",
            Self::Release { .. } => "release",
        }
    }
}

/// The daemon's view, as `tiermem status` shows it. Tenants the asker may not see are left
/// out and counted in `hidden_tenants` (their bytes still count in `held` of each pool).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    pub daemon: String,
    pub uptime_ms: u64,
    pub pools: Vec<PoolStatus>,
    pub tenants: Vec<TenantStatus>,
    pub hidden_tenants: u32,
    /// Lenders (`tiermem lend`) and what they lend to whom.
    #[serde(default)]
    pub lenders: Vec<LenderStatus>,
}

/// A lender and its slabs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LenderStatus {
    pub lender: u64,
    pub pid: u32,
    pub gpu: u32,
    pub offer: u64,
    /// Bytes of its slabs that tenants map now, by tenant.
    pub lent: Vec<(u64, u64)>,
    /// Bytes asked back and not yet returned.
    pub returning: u64,
}

/// One tier of one GPU (`gpu`: None for the node-wide tiers).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolStatus {
    pub tier: Tier,
    pub gpu: Option<u32>,
    pub capacity: u64,
    /// Bytes every tenant's budget allows together (what the daemon has handed out).
    pub budgeted: u64,
    pub used: u64,
    pub shares: Vec<ShareStatus>,
    /// For a GPU's HBM, what its driver counts (NVML), when the daemon could take a census.
    #[serde(default)]
    pub driver: Option<DriverAccounts>,
    /// A GPU's HBM whose tenants (two or more) take turns with their whole working sets (the
    /// daemon's `hbm_sharing`). Sent only when true.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub in_turns: bool,
}

/// A GPU's memory as its driver counts it, set against the tenants' chunks: the tenants'
/// chunks (`used` of the pool) + `overhead` + `others` make `used` here, up to the chunks'
/// movement between two reports. `capacity` of the pool is at most `total − others −
/// overhead` less a margin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverAccounts {
    pub total: u64,
    pub used: u64,
    /// Held by processes that are not tenants.
    pub others: u64,
    /// Held by tenant processes beyond their chunks (CUDA contexts, libraries, allocations
    /// made outside tiermem).
    pub overhead: u64,
    /// Why the census does not limit the capacity, where it does not.
    pub note: Option<String>,
}

/// One tenant's part of a pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShareStatus {
    pub tenant: u64,
    pub used: u64,
    pub acquired: u64,
    pub demand: u64,
    /// The budget in force.
    pub budget: u64,
    /// What the budget converges to: its fair share of what tenants demand, plus its part of
    /// what nobody demands (headroom).
    pub target: u64,
    /// Its own part if every tenant wanted all it may have.
    pub entitled: u64,
    /// Of its own part, lent to others (entitled − its share of the demand).
    pub lent: u64,
    /// Borrowed from others' idle parts (its share of the demand − entitled).
    pub borrowed: u64,
    /// Held beyond `used`, ready and not in use (the tenant's [`TierUsage::reserved`]).
    #[serde(default)]
    pub reserved: u64,
}

/// A connected tenant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantStatus {
    pub tenant: u64,
    /// The configured tenant it matched (or "default").
    pub name: String,
    pub pid: u32,
    pub uid: u32,
    pub cgroup: Option<String>,
    pub label: Option<String>,
    pub gpu: u32,
    /// The `tiermem run` its process runs under (`register`'s `job`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<u32>,
    pub weight: u32,
    pub priority: i32,
    pub connected_ms: u64,
    /// A budget cut not met within its deadline.
    pub late: bool,
    /// Has acquired nothing for the daemon's `idle_after_ms`: what it holds beyond its largest
    /// acquire is lent to the others.
    #[serde(default)]
    pub idle: bool,
    /// Set up less than the daemon's `ramp_ms` ago (its HBM demand still growing): it keeps its
    /// whole part rather than lend what it does not use yet.
    #[serde(default)]
    pub ramping: bool,
    /// Working but not admitted with its whole working set while another tenant is (the
    /// daemon's turns): it keeps a little and waits for its turn.
    #[serde(default)]
    pub waiting: bool,
    /// Told to start no GPU work meanwhile (a tenant that registered `waits`: a program under
    /// `tiermem run`), while it waits or while the tenant whose turn ended makes room for it.
    #[serde(default)]
    pub held: bool,
    /// In a turn of its whole working set that runs out while another tenant waits: the
    /// milliseconds left of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_left_ms: Option<u64>,
    /// What its process holds of its GPU beyond its chunks, by the driver's count (see
    /// [`DriverAccounts`]); `None` without a census.
    #[serde(default)]
    pub overhead: Option<u64>,
    /// Pinned host memory its engine holds, whether or not the daemon shares host memory out:
    /// its host tier's use and `host_ready`.
    #[serde(default)]
    pub host_pinned: u64,
    /// Of it, room pinned ahead for the evictions a budget cut will make
    /// ([`TierUsage::reserved`] of its host tier).
    #[serde(default)]
    pub host_ready: u64,
    /// What it moved and waited for since it started, and its kernel launches (a program under
    /// `tiermem run`), as it last reported them.
    #[serde(default)]
    pub transfers: TransferCounters,
}
