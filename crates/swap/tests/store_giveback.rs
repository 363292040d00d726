//! Give-back (monitor.rs): GPU work that claims HBM gets it back — the store stops taking more
//! at the soft limit, moves areas to the tiers below at the hard limit, grows again when the
//! work ends — with the device serving throughout; a grant is met on return and timed; the
//! monitor thread does it on its own; limits change at run time.
//!
//! GPU work is simulated by taking physical chunks from the simulated device beside the engine.

mod support;

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};
use support::{assert_device_holds, config, open, pattern, CHUNK};
use tiermem::mechanism::{Device, PhysHandle};
use tiermem_swap::{Blocks, Limits, Pressure, StoreConfig, SwapError, VramStore};

/// A GPU of 24 chunks; leave 8 free, give back below 4, grow past 10; 16 areas, 12 written.
fn gpu_config(name: &str) -> StoreConfig {
    let mut config = config(name, 16 * CHUNK, 24, 2, 24);
    config.limits =
        Limits { soft_free: 8 * CHUNK, hard_free: 4 * CHUNK, grow_margin: 2 * CHUNK, min_budget: 2 * CHUNK };
    config
}

fn fill(store: &VramStore, areas: u64) -> Vec<u8> {
    let bytes = pattern(42, (areas * CHUNK) as usize);
    store.write(0, &bytes).unwrap();
    bytes
}

/// GPU work: physical chunks taken from the device the store runs on.
struct Job<'a> {
    device: &'a dyn Device,
    chunks: Vec<PhysHandle>,
}

impl<'a> Job<'a> {
    fn new(store: &'a VramStore) -> Self {
        Self { device: store.engine().device().as_ref(), chunks: Vec::new() }
    }

    fn take(&mut self, chunks: usize) {
        for _ in 0..chunks {
            self.chunks.push(self.device.create_chunk().expect("the job's chunk"));
        }
    }

    /// Takes chunks until `left` are free (or the device refuses one: the store took it first).
    fn take_all_but(&mut self, left: u64, store: &VramStore) {
        while free_chunks(store) > left {
            match self.device.create_chunk() {
                Ok(chunk) => self.chunks.push(chunk),
                Err(_) => break,
            }
        }
    }

    fn end(&mut self) {
        for chunk in self.chunks.drain(..) {
            self.device.release_chunk(chunk).unwrap();
        }
    }
}

fn free_chunks(store: &VramStore) -> u64 {
    store.engine().device().mem_info().unwrap().0 as u64 / CHUNK
}

#[test]
fn gpu_work_gets_its_memory_back_and_the_device_grows_again_when_it_ends() {
    let store = open(gpu_config("giveback-job"));
    assert_eq!(store.stats().hbm_budget, 16 * CHUNK, "24 chunks, 8 left free");
    let bytes = fill(&store, 12);
    assert_eq!(store.hbm_held(), 12 * CHUNK);
    let idle = store.apply_limits().unwrap();
    assert_eq!((idle.decision.pressure, idle.decision.budget), (Pressure::Idle, 16 * CHUNK));

    let mut job = Job::new(&store);
    job.take(7); // 5 chunks free: below the soft level, above the hard one
    let soft = store.apply_limits().unwrap();
    assert_eq!((soft.decision.pressure, soft.decision.budget), (Pressure::Soft, 12 * CHUNK));
    assert!(soft.give_back.is_none());

    job.take(3); // 2 free: below the hard level; give back until 8 are free
    let hard = store.apply_limits().unwrap();
    assert_eq!((hard.decision.pressure, hard.decision.budget), (Pressure::Hard, 6 * CHUNK));
    let given = hard.give_back.expect("a give-back");
    assert_eq!((given.held_before, given.held_after), (12 * CHUNK, 6 * CHUNK));
    assert!(given.seconds > 0.0 && given.bytes_per_second() > 0.0);
    assert_eq!(free_chunks(&store), 8, "the job's GPU has its soft margin back");
    for _ in 0..3 {
        let again = store.apply_limits().unwrap();
        assert_eq!((again.decision.budget, again.give_back), (6 * CHUNK, None), "no oscillation");
    }
    assert_device_holds(&store, &bytes); // served through 6 chunks of HBM and the tiers below
    assert!(store.hbm_held() <= 6 * CHUNK);
    assert!(free_chunks(&store) >= 8, "serving took no more HBM from the job");

    job.end();
    let grown = store.apply_limits().unwrap();
    assert_eq!((grown.decision.pressure, grown.decision.budget), (Pressure::Idle, 16 * CHUNK));
    assert_device_holds(&store, &bytes);
    assert_eq!(store.hbm_held(), 12 * CHUNK, "the device came back to VRAM");
    let stats = store.stats();
    assert_eq!((stats.give_backs.count, stats.give_backs.bytes), (1, 6 * CHUNK), "{stats}");
    assert_eq!(stats.give_backs.last, Some(given));
}

#[test]
fn a_grant_is_met_when_set_external_cap_returns() {
    let store = open(gpu_config("giveback-grant"));
    let bytes = fill(&store, 12);
    let applied = store.set_external_cap(Some(3 * CHUNK)).unwrap();
    assert_eq!(applied.decision.budget, 3 * CHUNK);
    let given = applied.give_back.expect("a give-back");
    assert_eq!(given.bytes(), 9 * CHUNK);
    assert!(store.hbm_held() <= 3 * CHUNK, "met on return");
    assert_eq!(store.stats().external_cap, Some(3 * CHUNK));
    assert_device_holds(&store, &bytes);
    let lifted = store.set_external_cap(None).unwrap();
    assert_eq!((lifted.decision.budget, lifted.give_back), (16 * CHUNK, None));
}

#[test]
fn the_device_serves_every_byte_while_it_gives_back_and_grows() {
    let store = open(gpu_config("giveback-serving"));
    let size = 16 * CHUNK;
    let first = fill(&store, 12);
    let stop = AtomicBool::new(false);
    let mut job = Job::new(&store);
    std::thread::scope(|s| {
        let (store, stop) = (&store, &stop);
        let server = s.spawn(move || {
            let mut expected = first;
            expected.resize(size as usize, 0);
            let mut round = 0u64;
            while !stop.load(Relaxed) || round < 40 {
                let offset = (round * 7 % 60) * (CHUNK / 4);
                let len = CHUNK / 2 + (round % 3) * 4096;
                let len = len.min(size - offset);
                let data = pattern(round, len as usize);
                store.write(offset, &data).unwrap();
                expected[offset as usize..(offset + len) as usize].copy_from_slice(&data);
                let back = (round * 13 % 60) * (CHUNK / 4);
                let mut out = vec![0u8; (CHUNK / 2) as usize];
                store.read(back, &mut out).unwrap();
                assert!(out == expected[back as usize..back as usize + out.len()], "round {round}");
                round += 1;
            }
            expected
        });
        for _ in 0..6 {
            // 2 chunks free: below the hard level, so the store gives back whatever it holds.
            job.take_all_but(2, store);
            store.apply_limits().unwrap();
            std::thread::sleep(Duration::from_millis(5));
            job.end();
            store.apply_limits().unwrap();
        }
        stop.store(true, Relaxed);
        let expected = server.join().unwrap();
        assert_device_holds(store, &expected);
    });
    let stats = store.stats();
    assert_eq!(stats.requests.errors, 0);
    assert!(stats.give_backs.count > 0, "{stats}");
}

#[test]
fn the_monitor_thread_gives_back_and_grows_on_its_own() {
    let mut config = gpu_config("giveback-monitor");
    config.poll = Some(Duration::from_millis(5));
    let store = open(config);
    let bytes = fill(&store, 12);
    let wait_for = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "the monitor did not {what}: {}", store.stats());
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let mut job = Job::new(&store);
    // The monitor may step between the job's chunks: after the ninth (3 free, give back 5)
    // or only after the tenth (2 free, give back 6). Either way the job ends up with 7 or 8 free.
    job.take(10);
    wait_for("give back", &|| store.stats().give_backs.count >= 1 && free_chunks(&store) >= 7);
    assert!(store.hbm_held() <= 7 * CHUNK);
    assert_device_holds(&store, &bytes);
    job.end();
    wait_for("grow back", &|| store.stats().hbm_budget == 16 * CHUNK);
    assert_device_holds(&store, &bytes);
    assert_eq!(store.stats().monitor_errors, 0);
}

#[test]
fn limits_changed_at_run_time_apply_at_once_and_bad_ones_are_refused() {
    let store = open(gpu_config("giveback-set-limits"));
    fill(&store, 12);
    let before = store.stats().limits;
    let strict = Limits { soft_free: 20 * CHUNK, hard_free: 16 * CHUNK, ..before };
    let applied = store.set_limits(strict).unwrap();
    // 12 free, below the new hard level: give back until 20 are free.
    assert_eq!((applied.decision.pressure, applied.decision.budget), (Pressure::Hard, 4 * CHUNK));
    assert_eq!(applied.give_back.map(|g| g.bytes()), Some(8 * CHUNK));
    assert_eq!(store.stats().limits, strict);
    match store.set_limits(Limits { hard_free: 30 * CHUNK, ..strict }) {
        Err(e @ SwapError::Config { .. }) => assert!(e.to_string().contains("soft limit"), "{e}"),
        other => panic!("inverted limits accepted: {other:?}"),
    }
    assert_eq!(store.stats().limits, strict, "a refused change changes nothing");
    // A larger least budget raises the budget even under pressure.
    let roomy = Limits { min_budget: 6 * CHUNK, ..strict };
    assert_eq!(store.set_limits(roomy).unwrap().decision.budget, 6 * CHUNK);
}
