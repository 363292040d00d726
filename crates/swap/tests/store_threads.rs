//! Several threads at once, as FUSE's server threads call the store: on interleaved pages of
//! the same areas (every area shared, so first writes, zero fills, discards and frees of one
//! area race), on disjoint ranges that meet at area boundaries, and readers of one range —
//! while another thread moves the HBM budget. Each thread checks its reads against its own
//! model; at the end the whole device is checked against all of them.

mod support;

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use support::{assert_device_holds, config, open, pattern, Model, CHUNK};
use tiermem_swap::{Blocks, VramStore, PAGE};

const SIZE: u64 = 8 * CHUNK;

struct Rng(u64);

impl Rng {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound
    }
}

/// Moves the grant between two chunks and none until `stop`.
fn budget_mover(store: &VramStore, stop: &AtomicBool) {
    let mut k = 0u64;
    while !stop.load(Relaxed) {
        store.set_external_cap(if k.is_multiple_of(2) { Some(2 * CHUNK) } else { None }).unwrap();
        k += 1;
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// `ops` random operations on the pages `owns` accepts (runs of up to `run` pages), checking
/// every read against the thread's model, which it returns.
fn worker(store: &VramStore, seed: u64, ops: usize, run: u64, owns: impl Fn(u64) -> bool) -> Model {
    let mut model = Model::new(SIZE);
    let mut rng = Rng(seed | 1);
    let pages = SIZE / PAGE;
    let mut done = 0;
    while done < ops {
        let first = rng.below(pages);
        let count = 1 + rng.below(run);
        if !(first..(first + count).min(pages)).all(&owns) {
            continue;
        }
        done += 1;
        let (offset, mut len) = (first * PAGE, count.min(pages - first) * PAGE);
        // A quarter of the requests cover sectors of the run, not whole pages.
        let offset = if rng.below(4) == 0 {
            let skip = rng.below(8) * 512;
            len -= skip + rng.below(8.min(len / 512 - skip / 512)) * 512;
            offset + skip
        } else {
            offset
        };
        match rng.below(5) {
            0 | 1 => {
                let data = pattern(rng.below(u64::MAX), len as usize);
                store.write(offset, &data).unwrap();
                model.write(offset, &data);
            }
            2 => {
                store.discard(offset, len).unwrap();
                model.discard(offset, len);
            }
            _ => {
                let mut out = vec![0xA5; len as usize];
                store.read(offset, &mut out).unwrap();
                let want = &model.bytes[offset as usize..(offset + len) as usize];
                assert!(out == want, "thread {seed}: read of {len} at {offset} differs from its model");
            }
        }
    }
    model
}

/// Runs `threads` workers (`owner(page)` says whose a page is) beside the budget mover, then
/// checks the device against the merged models.
fn run(name: &str, threads: u64, run: u64, owner: impl Fn(u64) -> u64 + Sync) {
    let store = open(config(name, SIZE, 4, 1, 8));
    let stop = AtomicBool::new(false);
    let models: Vec<Model> = std::thread::scope(|s| {
        let mover = s.spawn(|| budget_mover(&store, &stop));
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (store, owner) = (&store, &owner);
                s.spawn(move || worker(store, 1000 + t, 400, run, |page| owner(page) == t))
            })
            .collect();
        let models = workers.into_iter().map(|w| w.join().unwrap()).collect();
        stop.store(true, Relaxed);
        mover.join().unwrap();
        models
    });
    let mut merged = Model::new(SIZE);
    for page in 0..SIZE / PAGE {
        let model = &models[owner(page) as usize];
        let range = (page * PAGE) as usize..((page + 1) * PAGE) as usize;
        merged.bytes[range.clone()].copy_from_slice(&model.bytes[range]);
        merged.present[page as usize] = model.present[page as usize];
    }
    assert_device_holds(&store, &merged.bytes);
    let stats = store.stats();
    assert_eq!(stats.bytes_present, merged.bytes_present(), "{stats}");
    assert_eq!(stats.areas_live, merged.areas_live(CHUNK), "{stats}");
    assert_eq!(store.engine().stats().buffers.len() as u64, stats.areas_live);
    assert_eq!(stats.requests.errors, 0);
}

#[test]
fn threads_on_interleaved_pages_of_shared_areas_keep_every_byte() {
    // Page p belongs to thread p % 4, so every area is written, discarded and freed by all four.
    run("threads-interleaved", 4, 1, |page| page % 4);
}

#[test]
fn threads_on_disjoint_ranges_that_meet_at_area_boundaries_keep_every_byte() {
    // Thread t owns [t * 1.5 chunks, (t + 1) * 1.5 chunks): ranges cross area boundaries and
    // two threads share every other area.
    let per_thread = 3 * CHUNK / 2 / PAGE;
    run("threads-ranges", 5, 64, |page| (page / per_thread).min(4));
}

#[test]
fn readers_of_one_range_all_see_it_while_writers_work_elsewhere() {
    let store = open(config("threads-readers", SIZE, 4, 1, 8));
    let shared = pattern(77, (3 * CHUNK) as usize);
    store.write(CHUNK / 2, &shared).unwrap();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (store, shared) = (&store, &shared);
            s.spawn(move || {
                let mut out = vec![0u8; shared.len()];
                for _ in 0..10 {
                    store.read(CHUNK / 2, &mut out).unwrap();
                    assert!(out == *shared, "reader {t} saw other bytes");
                }
            });
        }
        let store = &store;
        s.spawn(move || worker(store, 9, 300, 16, |page| page * PAGE >= 4 * CHUNK));
    });
}
