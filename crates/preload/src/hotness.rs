//! How hot each chunk is, from kernel launches (launch.rs): an index of tiermem's allocations
//! (start → end, chunk size, which chunks are on the host), and the pointers launches passed
//! since the last quiesce point that looked at them (an *epoch*), each with how many launches
//! passed it.
//!
//! # From pointers to chunks: extents
//!
//! A pointer says where a kernel's buffer starts, not how long it is. Counting only the chunk a
//! pointer falls in misses the rest of a large tensor; counting to the allocation's end marks
//! every tensor after it hot, since a caching allocator (PyTorch's) carves many tensors out of
//! one allocation. tiermem takes the middle: the distinct pointers seen in one allocation during
//! the epoch split it into *extents*, each from one pointer to the next pointer seen in the same
//! allocation (or the allocation's end), and each launch that passed a pointer heats every
//! chunk of its extent once. Tensors a program uses sit back to back in its allocator's
//! segments, so their starts, all seen within a step, partition the segments about as the
//! tensors do; free space after the last tensor of a segment is counted with it.
//!
//! # Cost
//!
//! A launch pays two compares per argument word (the span of all allocations) and, for words
//! inside it, one lock and a map lookup each (`record`; a test below logs the cost per launch).
//! The extents are computed once per epoch, at a quiesce point (`take_epoch`).
//!
//! Locking: one mutex over the index and the epoch, never held while calling the driver; the
//! span and the count of host chunks are atomics, read without it.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

/// Distinct pointers kept per epoch at most; beyond, new ones are not counted (a program whose
/// launches pass this many different addresses between two quiesce points is not one whose
/// hotness a per-pointer count describes anyway).
const MAX_SEEN: usize = 1 << 20;

/// One allocation as the index knows it.
struct Region {
    end: u64,
    chunk: u64,
    on_host: Vec<bool>,
}

struct Index {
    regions: BTreeMap<u64, Region>,
    /// Pointer → launches that passed it, this epoch (in address order, as the extents need).
    seen: BTreeMap<u64, u32>,
}

static INDEX: Mutex<Index> = Mutex::new(Index { regions: BTreeMap::new(), seen: BTreeMap::new() });
/// The span of all regions, `[LOW, HIGH)`; empty when `LOW >= HIGH`.
static LOW: AtomicU64 = AtomicU64::new(u64::MAX);
static HIGH: AtomicU64 = AtomicU64::new(0);
static HOST_CHUNKS: AtomicUsize = AtomicUsize::new(0);

/// Launches scanned, those that passed at least one pointer of tiermem's, and those whose
/// pointers all fell in chunks in HBM.
static SCANNED: AtomicU64 = AtomicU64::new(0);
static WITH_POINTERS: AtomicU64 = AtomicU64::new(0);
static ALL_IN_HBM: AtomicU64 = AtomicU64::new(0);

fn index() -> MutexGuard<'static, Index> {
    // Every change under the lock is one map update: consistent after a panic.
    INDEX.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Index {
    fn region_of(&self, ptr: u64) -> Option<(u64, &Region)> {
        self.regions.range(..=ptr).next_back().filter(|(_, r)| ptr < r.end).map(|(&start, r)| (start, r))
    }

    fn update_span(&self) {
        let low = self.regions.keys().next().copied().unwrap_or(u64::MAX);
        let high = self.regions.values().map(|r| r.end).max().unwrap_or(0);
        LOW.store(low, Relaxed);
        HIGH.store(high, Relaxed);
    }
}

/// Whether launches are worth scanning for heat: some chunk is on the host.
pub fn watching() -> bool {
    HOST_CHUNKS.load(Relaxed) > 0
}

/// Scanning launches while every chunk is in HBM too (see [`scanning`]).
static ALWAYS: AtomicBool = AtomicBool::new(false);

/// Keeps the launches scanned and the cycles recorded while every chunk is in HBM: a program
/// whose budget the node daemon may cut at any moment (lease.rs) then has a recorded cycle to
/// plan the cut by — the chunks used furthest ahead going down, the rest of the step paged —
/// where one scanned only from the cut on would send down chunks it knows nothing about, which
/// the step then reads over PCIe (on the H200, 8 s of a 0.23 s step).
pub fn scan_always() {
    ALWAYS.store(true, Relaxed);
}

/// Whether launches are scanned and recorded (launch.rs): [`watching`], or [`scan_always`].
pub fn scanning() -> bool {
    watching() || ALWAYS.load(Relaxed)
}

/// Whether `word` is in the span of tiermem's allocations (cheap; `record` decides).
pub fn may_hold(word: u64) -> bool {
    word >= LOW.load(Relaxed) && word < HIGH.load(Relaxed)
}

/// Whether a graph's replay was counted this epoch ([`record_replay`]).
static REPLAYED: AtomicBool = AtomicBool::new(false);

/// Counts one replay of a graph whose captured launches passed `words` (graphs.rs): as
/// [`record`], and marks the epoch as holding heat that stage 3's cycles do not see.
pub fn record_replay(words: &[u64]) {
    if watching() {
        REPLAYED.store(true, Relaxed);
    }
    record(words);
}

/// Whether this epoch counted a graph's replay while chunks were on the host: heat that
/// stage 3 cannot place (migrate.rs lets stage 2 place it beside a cycle with nothing to move).
pub fn replayed() -> bool {
    REPLAYED.load(Relaxed)
}

/// Counts one launch that passed the candidate pointers `words`; how many of them point into
/// chunks on the host.
pub fn record(words: &[u64]) -> usize {
    SCANNED.fetch_add(1, Relaxed);
    if words.is_empty() {
        return 0;
    }
    let mut index = index();
    let (mut any, mut on_host) = (false, 0);
    // Heat is for chunks on the host to come up; with none there, nothing reads it.
    let heat = watching();
    for &word in words {
        let Some((start, region)) = index.region_of(word) else { continue };
        any = true;
        on_host += usize::from(region.on_host[((word - start) / region.chunk) as usize]);
        if !heat {
            continue;
        }
        let room = index.seen.len() < MAX_SEEN;
        match index.seen.get_mut(&word) {
            Some(count) => *count = count.saturating_add(1),
            None if room => drop(index.seen.insert(word, 1)),
            None => {}
        }
    }
    if any {
        WITH_POINTERS.fetch_add(1, Relaxed);
        ALL_IN_HBM.fetch_add(u64::from(on_host == 0), Relaxed);
    }
    on_host
}

/// The chunks on the host that `words` point into, as `(allocation start, chunk index)` (for
/// the trace).
pub fn host_chunks_of(words: &[u64]) -> Vec<ChunkId> {
    let index = index();
    words
        .iter()
        .filter_map(|&word| {
            let (start, region) = index.region_of(word)?;
            let chunk = ((word - start) / region.chunk) as usize;
            region.on_host[chunk].then_some((start, chunk))
        })
        .collect()
}

/// A new allocation `[start, end)`, of `on_host.len()` chunks of `chunk` bytes (the last one
/// shorter).
pub fn insert(start: u64, end: u64, chunk: usize, on_host: Vec<bool>) {
    let mut index = index();
    HOST_CHUNKS.fetch_add(on_host.iter().filter(|&&h| h).count(), Relaxed);
    index.regions.insert(start, Region { end, chunk: chunk as u64, on_host });
    index.update_span();
}

/// The allocation at `start` is freed.
pub fn remove(start: u64) {
    let mut index = index();
    if let Some(region) = index.regions.remove(&start) {
        HOST_CHUNKS.fetch_sub(region.on_host.iter().filter(|&&h| h).count(), Relaxed);
    }
    index.update_span();
}

/// Chunk `chunk` of the allocation at `start` moved to the host (`true`) or to HBM.
pub fn moved(start: u64, chunk: usize, to_host: bool) {
    let mut index = index();
    let Some(slot) = index.regions.get_mut(&start).and_then(|r| r.on_host.get_mut(chunk)) else { return };
    if *slot != to_host {
        *slot = to_host;
        if to_host {
            HOST_CHUNKS.fetch_add(1, Relaxed);
        } else {
            HOST_CHUNKS.fetch_sub(1, Relaxed);
        }
    }
}

/// Per allocation start, the heat of each of its chunks this epoch (absent: no heat).
pub type Heats = HashMap<u64, Vec<u64>>;

/// Ends the epoch: the heat of each chunk from the extents of the pointers seen (module docs).
pub fn take_epoch() -> Heats {
    let mut index = index();
    REPLAYED.store(false, Relaxed);
    let seen: Vec<(u64, u32)> = std::mem::take(&mut index.seen).into_iter().collect();
    let mut heats = Heats::new();
    let mut at = 0;
    while at < seen.len() {
        let Some((start, region)) = index.region_of(seen[at].0) else {
            at += 1;
            continue;
        };
        let within = seen[at..].iter().take_while(|(ptr, _)| *ptr < region.end).count();
        let pointers = &seen[at..at + within];
        let chunk_heats = heats.entry(start).or_insert_with(|| vec![0; region.on_host.len()]);
        for (i, &(ptr, count)) in pointers.iter().enumerate() {
            let extent_end = pointers.get(i + 1).map_or(region.end, |next| next.0);
            let first = ((ptr - start) / region.chunk) as usize;
            let last = ((extent_end - 1 - start) / region.chunk) as usize;
            for heat in &mut chunk_heats[first..=last] {
                *heat += u64::from(count);
            }
        }
        at += within;
    }
    heats
}

/// A chunk: its allocation's start and its index there.
pub type ChunkId = (u64, usize);

/// For each launch of a recorded cycle (cycle.rs), given the pointers it passed, the chunks it
/// touches: the extents (module docs) of its pointers, at most `cap` chunks per launch (those of
/// its first pointers). Pointers now in no allocation are dropped.
///
/// `window` says which other pointers end an extent: `None`, every pointer the whole cycle
/// passed; `Some(w)`, only those passed by the launches at most `w` before or after it, since
/// a pointer passed far away in the cycle may be a block the allocator carved later out of
/// memory that this launch's tensor held (`Some(0)`: the launch's own pointers alone, each
/// extent running on to the next of them or the allocation's end).
pub fn launch_chunks(launches: &[&[u64]], cap: usize, window: Option<usize>) -> Vec<Vec<ChunkId>> {
    let index = index();
    let chunks_of = |words: &[u64], next: &dyn Fn(u64) -> Option<u64>| {
        let mut chunks: Vec<ChunkId> = Vec::new();
        for &ptr in words {
            let Some((start, region)) = index.region_of(ptr) else { continue };
            let end = next(ptr).filter(|&n| n < region.end).unwrap_or(region.end);
            let first = ((ptr - start) / region.chunk) as usize;
            let last = ((end - 1 - start) / region.chunk) as usize;
            chunks.extend((first..=last).map(|c| (start, c)).take(cap.saturating_sub(chunks.len())));
        }
        chunks.sort_unstable();
        chunks.dedup();
        chunks
    };
    let Some(window) = window else {
        let mut pointers: Vec<u64> = launches.iter().flat_map(|words| words.iter().copied()).collect();
        pointers.sort_unstable();
        pointers.dedup();
        let next = |ptr: u64| pointers.get(pointers.partition_point(|&p| p <= ptr)).copied();
        return launches.iter().map(|words| chunks_of(words, &next)).collect();
    };
    // A window wider than the cycle is the whole cycle (and no sum below overflows).
    let window = window.min(launches.len());
    // The pointers of launches [i - window, i + window], counted, as i moves on.
    let mut near: BTreeMap<u64, usize> = BTreeMap::new();
    let add = |near: &mut BTreeMap<u64, usize>, words: &[u64], by: isize| {
        for &w in words {
            let count = near.entry(w).or_insert(0);
            *count = count.saturating_add_signed(by);
            if *count == 0 {
                near.remove(&w);
            }
        }
    };
    for words in launches.iter().take(window) {
        add(&mut near, words, 1);
    }
    let mut out = Vec::with_capacity(launches.len());
    for (i, words) in launches.iter().enumerate() {
        if let Some(entering) = launches.get(i + window) {
            add(&mut near, entering, 1);
        }
        if let Some(leaving) = i.checked_sub(window + 1).map(|j| launches[j]) {
            add(&mut near, leaving, -1);
        }
        let next = |ptr: u64| near.range(ptr + 1..).next().map(|(&p, _)| p);
        out.push(chunks_of(words, &next));
    }
    out
}

/// Launches scanned, with pointers of tiermem's, and with all of those in HBM, so far.
pub fn launch_counts() -> (u64, u64, u64) {
    (SCANNED.load(Relaxed), WITH_POINTERS.load(Relaxed), ALL_IN_HBM.load(Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHUNK: usize = 2 << 20;

    /// The index is process-wide: the tests that use it run one at a time.
    static SERIAL: Mutex<()> = Mutex::new(());

    #[test]
    fn extents_run_from_one_pointer_to_the_next_seen_in_the_allocation() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let a = 0x7000_0000_0000u64;
        insert(a, a + 5 * CHUNK as u64, CHUNK, vec![false, false, true, true, false]);
        assert!(watching() && may_hold(a + 3) && !may_hold(a + 5 * CHUNK as u64) && !may_hold(a - 1));
        // A tensor at the start (seen twice), one in chunk 2 up to the end; a word outside.
        record(&[a + 16, a + 2 * CHUNK as u64 + 8, 42]);
        record(&[a + 16]);
        let heats = take_epoch();
        assert_eq!(heats[&a], [2, 2, 3, 1, 1], "a + 16 reaches to a + 2 chunks + 8: chunk 2 is in both extents");
        assert!(take_epoch().is_empty(), "a new epoch starts empty");
        moved(a, 2, false);
        moved(a, 3, false);
        assert!(!watching(), "no chunk on the host: launches are not scanned");
        remove(a);
        assert!(!may_hold(a + 3));
    }

    #[test]
    fn a_launchs_extents_end_at_pointers_passed_near_it() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let a = 0x5000_0000_0000u64;
        let at = |chunk: u64| a + chunk * CHUNK as u64;
        insert(a, at(8), CHUNK, vec![false; 8]);
        // Launch 0 reads a tensor of chunks 0..4; the allocator later carves a block at chunk 2
        // out of that memory (launch 3), and launch 1 passes one at chunk 6.
        let launches: [&[u64]; 4] = [&[at(0)], &[at(6)], &[99], &[at(2)]];
        let cycle = launch_chunks(&launches, 64, None);
        let ids = |chunks: std::ops::Range<usize>| chunks.map(|c| (a, c)).collect::<Vec<_>>();
        assert_eq!(cycle[0], ids(0..2), "the whole cycle's pointers cut launch 0 at chunk 2");
        assert_eq!(launch_chunks(&launches, 64, Some(1))[0], ids(0..6), "launch 3 is not near it");
        assert_eq!(launch_chunks(&launches, 64, Some(3))[0], ids(0..2), "within three launches it is");
        let alone = launch_chunks(&launches, 64, Some(0));
        assert_eq!((alone[0].clone(), alone[3].clone()), (ids(0..8), ids(2..8)), "alone: to the allocation's end");
        assert_eq!(launch_chunks(&launches, 3, Some(0))[0], ids(0..3), "at most cap chunks");
        assert!(cycle[2].is_empty(), "a word in no allocation touches nothing");
        assert_eq!(launch_chunks(&launches, 64, Some(usize::MAX)), cycle, "a window wider than the cycle is the cycle");
        remove(a);
    }

    /// The cost of `record` per launch of 8 pointers among 1000 allocations (logged; the bound
    /// only catches a pathological slowdown, CI machines vary).
    #[test]
    fn recording_a_launch_costs_about_a_microsecond() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let base = 0x6000_0000_0000u64;
        for i in 0..1000u64 {
            let start = base + i * 64 * CHUNK as u64;
            insert(start, start + 32 * CHUNK as u64, CHUNK, vec![i % 2 == 0; 32]);
        }
        let launches = 100_000u64;
        let started = std::time::Instant::now();
        for l in 0..launches {
            let words: Vec<u64> =
                (0..8).map(|k| base + ((l * 7 + k * 131) % 1000) * 64 * CHUNK as u64 + k * 4096).collect();
            record(&words);
        }
        let per_launch = started.elapsed() / launches as u32;
        let epoch = std::time::Instant::now();
        let heats = take_epoch();
        eprintln!("hotness: record {per_launch:?} per launch of 8 pointers; take_epoch {:?}", epoch.elapsed());
        assert!(heats.len() == 1000 && per_launch < std::time::Duration::from_micros(50));
        for i in 0..1000u64 {
            remove(base + i * 64 * CHUNK as u64);
        }
        assert!(!watching());
    }
}
