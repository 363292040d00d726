//! The engine's statistics: each tier's use (indexed by [`Tier`]), transfer counters and
//! per-buffer residency, as a snapshot ([`Stats`]) that prints as a table and serializes with
//! serde (front ends turn it into a Python dict or JSON without copying it field by field).

use crate::chunk_pool::ChunkPool;
use crate::config::format_size;
use crate::host_tier::HostTier;
use crate::peer_tier::PeerTier;
use crate::state::{Buffer, ChunkTable, Location};
use crate::BufferId;
use std::collections::BTreeMap;
use tiermem_mechanism::file_store::FileStore;
use tiermem_mechanism::timing::DriverTimes;
use tiermem_policy::{PolicyKind, Tier};

/// Transfer counters since the engine started (chunks, except where a name says bytes).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Counters {
    /// Chunks copied host → HBM (demand, prefetch and page_in).
    pub page_ins: u64,
    /// Chunks copied HBM → host.
    pub page_outs: u64,
    /// Never-written chunks made resident as zeros (no copy).
    pub zero_fills: u64,
    /// Clean chunks evicted by unmapping alone.
    pub clean_drops: u64,
    /// Chunks whose bytes were discarded (`Engine::discard`): memory given up, nothing copied.
    pub discarded: u64,
    /// Chunks chosen as victims by the policy.
    pub evictions: u64,
    /// Dirty chunks that handed their physical chunk to a chunk coming in (home, or as zeros)
    /// while their copy down was still running, the copy in or the zero fill queued behind it
    /// on the device (hand_overs.rs).
    pub handed_over: u64,
    /// Chunks brought in by `prefetch`.
    pub prefetched: u64,
    /// Chunks written to the file tier (spilled chunks whose bytes the file already held are not).
    pub file_writes: u64,
    /// Chunks read from the file tier.
    pub file_reads: u64,
    /// Device time of the demand copies that acquiring streams waited on, in milliseconds
    /// (0 on the simulated device, which has no clock).
    pub stall_ms: f64,
    /// Chunks mapped afresh (`cuMemMap`); a chunk coming back to the physical chunk its stale
    /// mapping points at is not.
    pub maps: u64,
    /// Chunks whose address was mapped to their slot in a neighbour's HBM, to be read there.
    pub in_place_maps: u64,
    /// Chunks acquired where they lie in a neighbour's HBM (read over NVLink, no copy).
    pub in_place_reads: u64,
    /// Chunks of `page_ins` copied from the host tier by a lender's copy engine, through its
    /// PCIe link (multipath.rs).
    pub by_neighbours: u64,
    /// Chunks whose only copy was in a neighbour's HBM, copied to the host tier in the
    /// background so that the lender can take the memory back without a copy (movement.rs, "Cleaning borrowed chunks").
    pub cleaned: u64,
    /// Host time spent mapping chunks and setting their access (driver calls), in milliseconds,
    /// as the device's timing adaptor measured it ([`crate::Engine::driver_times`]).
    pub map_ms: f64,
    /// Host time spent unmapping chunks, in milliseconds (from the timing adaptor too).
    pub unmap_ms: f64,
    /// Host time spent waiting for evicted chunks to leave (the GPU's last use of them, or
    /// their copy down), in milliseconds.
    pub evict_wait_ms: f64,
    /// Acquires tried (the program's, and those of `read` and `write`; one refused for want
    /// of HBM counts too, and one that waited for room counts once per try): a node daemon
    /// tells a working tenant, even one waiting for its budget, from an idle one by them.
    pub acquires: u64,
    /// The most chunks one acquire has asked for: the HBM a tenant needs to go on at all.
    pub largest_acquire: u64,
}

/// One tier's use.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TierStats {
    pub capacity_bytes: usize,
    pub used_bytes: usize,
    pub chunks: usize,
}

/// The use of each tier the engine has (HBM and host always; the file tier if configured).
/// Index it by tier (`stats.tiers[Tier::Hbm]`) or ask with [`PerTier::get`]. It serializes as
/// one entry per tier of [`Tier::ALL`], `null` for a tier the engine does not have.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PerTier(BTreeMap<Tier, TierStats>);

impl PerTier {
    /// The tier's use, if the engine has it.
    pub fn get(&self, tier: Tier) -> Option<&TierStats> {
        self.0.get(&tier)
    }

    /// The tiers the engine has, fastest first.
    pub fn iter(&self) -> impl Iterator<Item = (Tier, &TierStats)> {
        self.0.iter().map(|(tier, stats)| (*tier, stats))
    }
}

impl std::ops::Index<Tier> for PerTier {
    type Output = TierStats;

    /// Panics for a tier the engine does not have (only the file tier may be missing).
    fn index(&self, tier: Tier) -> &TierStats {
        self.get(tier).unwrap_or_else(|| panic!("the engine has no {tier} tier"))
    }
}

impl serde::Serialize for PerTier {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(Tier::ALL.len()))?;
        for tier in Tier::ALL {
            map.serialize_entry(tier.name(), &self.get(tier))?;
        }
        map.end()
    }
}

/// Where one buffer's chunks are.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BufferStats {
    /// Serialized as the bare number.
    #[serde(serialize_with = "buffer_number")]
    pub id: BufferId,
    pub name: Option<String>,
    pub size: usize,
    pub priority: i32,
    pub read_only: bool,
    pub chunks: usize,
    pub in_hbm: usize,
    /// Located in HBM lent by a neighbour GPU.
    pub in_peer: usize,
    /// Of those, mapped in place: kernels read them there (`Access::InPlaceOk`).
    pub in_place: usize,
    pub in_host: usize,
    pub in_file: usize,
    pub empty: usize,
    pub moving: usize,
    pub acquired: usize,
}

/// A snapshot of the engine. May miss transfers completed since the last engine call.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Stats {
    /// Serialized as its name ("lru", …).
    #[serde(serialize_with = "as_text")]
    pub policy: PolicyKind,
    pub chunk_size: usize,
    /// Each tier's use; serialized as the keys `hbm`, `peer`, `host` and `file` of the snapshot.
    #[serde(flatten)]
    pub tiers: PerTier,
    /// Pinned host memory held by the host tier (it is pinned in slabs, ahead of use).
    pub host_pinned_bytes: usize,
    pub transfers: Counters,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Chunks of every live buffer together.
    pub allocated_chunks: usize,
    /// Chunks acquired while in HBM (HBM no budget cut can take): those read in place from a
    /// neighbour's HBM take none, and are not counted.
    pub acquired_in_hbm: usize,
    /// Per buffer; empty in a summary (`Engine::summary`).
    pub buffers: Vec<BufferStats>,
}

fn buffer_number<S: serde::Serializer>(id: &BufferId, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_u64(id.0)
}

fn as_text<S: serde::Serializer>(value: &impl std::fmt::Display, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(value)
}

/// What a snapshot is taken of.
pub(crate) struct Sources<'a> {
    pub state: &'a ChunkTable,
    pub hbm: &'a ChunkPool,
    pub peer: &'a PeerTier,
    pub host: &'a HostTier,
    pub file: Option<&'a FileStore>,
    pub policy: PolicyKind,
    pub counters: &'a Counters,
    /// Driver-call times from the device's timing adaptor: `map_ms` and `unmap_ms` come from
    /// here, not from `counters`.
    pub driver: &'a DriverTimes,
}

impl BufferStats {
    /// Where `b`'s chunks are, in one pass over them.
    fn of(id: BufferId, b: &Buffer) -> BufferStats {
        let mut s = BufferStats {
            id,
            name: b.options.name.clone(),
            size: b.size,
            priority: b.options.priority,
            read_only: b.options.read_only,
            chunks: b.chunks().len(),
            in_hbm: 0,
            in_peer: 0,
            in_place: 0,
            in_host: 0,
            in_file: 0,
            empty: 0,
            moving: 0,
            acquired: 0,
        };
        for c in b.chunks() {
            *match c.location() {
                Location::Hbm { leaving: false, .. } => &mut s.in_hbm,
                Location::Hbm { leaving: true, .. } => &mut s.moving,
                Location::Peer(_) => &mut s.in_peer,
                Location::Host(_) => &mut s.in_host,
                Location::File(_) => &mut s.in_file,
                Location::Empty => &mut s.empty,
            } += 1;
            s.in_place += usize::from(c.is_in_place());
            s.acquired += usize::from(c.pins() > 0);
        }
        s
    }
}

impl Stats {
    /// A snapshot; with `per_buffer`, where each buffer's chunks are (a pass over every chunk),
    /// otherwise `buffers` is empty and the rest costs a step per buffer.
    pub(crate) fn collect(from: Sources<'_>, per_buffer: bool) -> Stats {
        let g = from.state.chunk_size();
        let buffers: Vec<BufferStats> = match per_buffer {
            true => from.state.buffers().map(|(id, b)| BufferStats::of(id, b)).collect(),
            false => Vec::new(),
        };
        let tier = |used: usize, cap: usize| TierStats { capacity_bytes: cap * g, used_bytes: used * g, chunks: used };
        let mut tiers = BTreeMap::from([
            (Tier::Hbm, tier(from.hbm.in_use(), from.hbm.cap())),
            (Tier::Host, tier(from.host.in_use(), from.host.cap())),
        ]);
        if from.peer.exists() {
            tiers.insert(Tier::Peer, tier(from.peer.in_use(), from.peer.cap()));
        }
        if let Some(store) = from.file {
            tiers.insert(Tier::File, tier(store.used_slots(), store.capacity_slots()));
        }
        Stats {
            policy: from.policy,
            chunk_size: g,
            tiers: PerTier(tiers),
            host_pinned_bytes: from.host.pinned_bytes(),
            bytes_in: from.counters.page_ins * g as u64,
            bytes_out: from.counters.page_outs * g as u64,
            allocated_chunks: from.state.buffers().map(|(_, b)| b.chunks().len()).sum(),
            acquired_in_hbm: from.state.pinned(),
            transfers: Counters {
                map_ms: from.driver.map.ms + from.driver.set_access.ms,
                unmap_ms: from.driver.unmap.ms,
                ..from.counters.clone()
            },
            buffers,
        }
    }
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = &self.transfers;
        writeln!(f, "tier   {:>12} {:>12} {:>8}", "used", "capacity", "chunks")?;
        for (name, tier) in self.tiers.iter() {
            writeln!(
                f,
                "{name:<6} {:>12} {:>12} {:>8}",
                format_size(tier.used_bytes),
                format_size(tier.capacity_bytes),
                tier.chunks
            )?;
        }
        writeln!(f, "policy {}; pinned for the host tier: {}", self.policy, format_size(self.host_pinned_bytes))?;
        writeln!(
            f,
            "page-ins {} ({}), page-outs {} ({}), zero-fills {}, clean drops {}, discarded {}, evictions {} ({} handed over), prefetched {}, file writes {}, file reads {}, streams waited {:.2} ms",
            t.page_ins,
            format_size(self.bytes_in as usize),
            t.page_outs,
            format_size(self.bytes_out as usize),
            t.zero_fills,
            t.clean_drops,
            t.discarded,
            t.evictions,
            t.handed_over,
            t.prefetched,
            t.file_writes,
            t.file_reads,
            t.stall_ms
        )?;
        if !self.buffers.is_empty() {
            writeln!(
                f,
                "buffer {:<16} {:>10} {:>6} {:>6} {:>6} {:>6} {:>6}",
                "name", "size", "hbm", "host", "empty", "moving", "acq"
            )?;
            const SHOWN: usize = 12;
            for b in self.buffers.iter().take(SHOWN) {
                let name = b.name.as_deref().unwrap_or("-");
                writeln!(
                    f,
                    "{:<6} {:<16} {:>10} {:>6} {:>6} {:>6} {:>6} {:>6}",
                    b.id.to_string(),
                    name,
                    format_size(b.size),
                    b.in_hbm,
                    b.in_host,
                    b.empty,
                    b.moving,
                    b.acquired
                )?;
            }
            if self.buffers.len() > SHOWN {
                writeln!(f, "… and {} more buffers", self.buffers.len() - SHOWN)?;
            }
        }
        Ok(())
    }
}
