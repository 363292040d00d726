//! Eviction policies for tiermem: which 2 MiB chunks leave GPU HBM when it is full.
//!
//! The engine owns all state. When it needs room it hands a policy a slice of
//! [`Candidate`]s (every chunk that may be evicted right now) and asks for a number of
//! victims; the policy answers with indices into that slice, in eviction order. Policies
//! do no I/O and touch no device: given the same seed and the same sequence of calls they
//! return the same answers, which keeps experiments reproducible.
//!
//! * [`PolicyKind::Lru`] — evict the least recently used chunks. The default: recency is the
//!   best cheap predictor of reuse for the streaming and iterative workloads tiermem targets.
//! * [`PolicyKind::LruCost`] — GDM §4.4. Pure LRU ignores that evictions differ in price:
//!   a *clean* chunk already has an identical copy in a lower tier and leaves by unmapping
//!   alone, while a *dirty* one must first be copied down. LRU-COST takes the bottom
//!   [`LRU_COST_SELECTION_FACTOR`] of the LRU stack (at least as many chunks as requested),
//!   moves clean chunks ahead of dirty ones within that window, keeps LRU order among equals,
//!   and evicts from the front. Recently used chunks above the window are never touched, so
//!   the saving in copy traffic does not cost hit rate on the hot set.
//! * [`PolicyKind::Priority`] — GPrioSwap §4.2. Buffers carry a priority (larger is more
//!   important); victims are taken from the lowest priority upwards, and among chunks of
//!   equal priority the decision is random (seeded), as in GPrioSwap's decision set, so no
//!   single buffer of a class is systematically punished.
//! * [`PolicyKind::Random`] — uniform random victims (seeded): the worst-case baseline that
//!   every informed policy has to beat.
//! * [`PolicyKind::Belady`] — when the program's schedule is known (a model's layers run in the
//!   same order every pass), evict the chunk whose next use is furthest away: Belady's optimum
//!   on the replayed schedule. A loop over more layers than fit is LRU's worst case (each layer
//!   leaves just before it is needed again); Belady keeps what fits resident and streams only
//!   the rest. Chunks the schedule never uses go first (oldest first); with no schedule at all
//!   this is LRU.
//!
//! With a schedule, [`spread_resident`] plans which buffers Belady keeps resident for the
//! whole pass, spread along it rather than in one stretch, so that a short paging window
//! keeps the copy link busy.
//!
//! Beside eviction, [`leave_hbm`] decides where a victim goes (the tiers below HBM, in order),
//! [`read_in_place`] whether an acquire reads a chunk in a neighbour's HBM where it lies,
//! [`split_between_paths`] how a page-in from host memory divides between PCIe links,
//! [`Stride`] what a walk through a buffer will want next, [`LinkBudget`] how much traffic a busy
//! lender takes, and [`share`] divides a tier among tenants (the node daemon's weighted fair
//! share, GPrioSwap §4), or [`admission`] admits whole working sets first (its turns:
//! `working-sets` sharing, and by default among programs under `tiermem run`).

use std::fmt;
use std::str::FromStr;

pub mod admission;
mod belady;
mod destination;
mod in_place;
mod lru;
mod lru_cost;
mod paths;
mod priority;
mod random;
pub mod share;
mod spread;
mod stride;
mod throttle;
mod tier;

pub use destination::{leave_hbm, Leave};
pub use in_place::{read_in_place, PeerRead};
pub use paths::{split_between_paths, Piece};
pub use spread::{spread_resident, Scheduled};
pub use stride::Stride;
pub use throttle::LinkBudget;
pub use tier::Tier;

/// Fraction of the LRU stack (its least recently used end) that LRU-COST re-sorts by cost.
pub const LRU_COST_SELECTION_FACTOR: f64 = 0.2;

/// One evictable chunk, as the engine describes it to a policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// Opaque chunk identifier chosen by the engine.
    pub key: u64,
    /// Logical clock of the last acquire/touch; smaller is older.
    pub last_use: u64,
    /// A valid copy exists in a lower tier, so evicting costs no copy.
    pub clean: bool,
    /// Priority of the owning buffer; larger is more important and kept longer.
    pub priority: i32,
    /// Steps until a known schedule next uses the chunk (`None`: no known next use).
    pub next_use: Option<u64>,
    /// In the planned resident set of a schedule ([`spread_resident`]): Belady takes it only
    /// after every other candidate. Other policies ignore it.
    pub kept: bool,
}

/// The available eviction policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyKind {
    /// Least recently used first.
    Lru,
    /// LRU window re-sorted so clean chunks go before dirty ones (GDM §4.4).
    LruCost,
    /// Lowest priority first, seeded random among equals (GPrioSwap §4.2).
    Priority,
    /// Uniform random, seeded.
    Random,
    /// Furthest next use in a known schedule first (Belady's optimum).
    Belady,
}

impl PolicyKind {
    /// Every policy, in declaration order.
    pub const ALL: [PolicyKind; 5] = [Self::Lru, Self::LruCost, Self::Priority, Self::Random, Self::Belady];

    fn name(self) -> &'static str {
        match self {
            Self::Lru => "lru",
            Self::LruCost => "lru-cost",
            Self::Priority => "priority",
            Self::Random => "random",
            Self::Belady => "belady",
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A policy name that [`PolicyKind::from_str`] does not recognise.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown eviction policy `{0}` (expected one of: lru, lru-cost, priority, random, belady)")]
pub struct UnknownPolicy(pub String);

impl FromStr for PolicyKind {
    type Err = UnknownPolicy;

    /// Parses a policy name, ignoring ASCII case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownPolicy(s.to_owned()))
    }
}

/// A victim-selection strategy.
pub trait EvictionPolicy: Send {
    /// Which policy this is.
    fn kind(&self) -> PolicyKind;

    /// Picks up to `count` victims among `candidates` (all of which are evictable right now).
    /// Returns indices into `candidates`, distinct, in eviction order. Returns min(count, len) indices.
    fn select_victims(&mut self, candidates: &[Candidate], count: usize) -> Vec<usize>;
}

/// Creates a policy of the given kind; `seed` drives any randomness it uses.
pub fn new_policy(kind: PolicyKind, seed: u64) -> Box<dyn EvictionPolicy> {
    match kind {
        PolicyKind::Lru => Box::new(lru::Lru),
        PolicyKind::LruCost => Box::new(lru_cost::LruCost),
        PolicyKind::Priority => Box::new(priority::Priority::new(seed)),
        PolicyKind::Random => Box::new(random::Random::new(seed)),
        PolicyKind::Belady => Box::new(belady::Belady),
    }
}

/// The `count` indices in `0..len` with the smallest keys, in ascending key order.
///
/// Keys must be distinct (append the index to break ties) so the result is deterministic.
fn smallest_by_key<K: Ord>(len: usize, count: usize, key: impl Fn(usize) -> K) -> Vec<usize> {
    let mut indices: Vec<usize> = (0..len).collect();
    if count < len {
        indices.select_nth_unstable_by_key(count, |&i| key(i));
        indices.truncate(count);
    }
    indices.sort_unstable_by_key(|&i| key(i));
    indices
}
