//! Model checks of the engine's threads, run under shuttle's controlled scheduler (sync.rs).
//!
//! ```text
//! cargo test -p tiermem --features shuttle --lib model_checks
//! ```
//!
//! Each check runs a small scenario under `shuttle::check_random` and `shuttle::check_pct`
//! (which favours schedules with few, well-placed preemptions, where most concurrency bugs
//! hide), on a simulated device of each timing (`Timing::ALL`: copies done at once, only when
//! waited for, or late): 3 × 2 × [`SCHEDULES`] schedules per check, 3 × 2 ×
//! [`ENGINE_SCHEDULES`] for the whole engine; about 20 s in all on two cores. The device
//! adds a scheduling point before each of its calls, as time passing in a driver call lets
//! other threads run. A scenario fails if an assertion fails in any thread, or if every
//! thread is blocked — a fence that nobody will ever record — which shuttle reports as a
//! deadlock with the schedule (and seed) that led to it, for `shuttle::replay`.
//!
//! * **Later fences** (fence.rs): one thread records or fails the fence while others call
//!   `recorded`, `event`, `is_done` and `wait`. Nobody blocks forever, `is_done` is never true
//!   before the record or failure has begun, and a failure reaches every `recorded`.
//! * **The event pool**: threads record, combine (`after_all`), fail and drop fences at once.
//!   No event is held by two live fences at a time, the pool makes no more events than
//!   fences can be live at once, and each event is destroyed exactly once, after its last use.
//! * **The file reader** (file_reads.rs): groups submitted from several threads while another
//!   stops the reader. Every group's fence ends recorded — its bytes arrived — or failed
//!   because it came after the stop; the reader thread exits and gives its staging area and
//!   stream back.
//! * **A read group dropped unserved** — in the hands of a reader thread that panicked, or
//!   queued behind it — fails its fence, so the chunks' waiters wake with an error.
//! * **The whole engine** with a file tier: a page-in from the file, a background page-out to
//!   the file and an acquire, from three threads, each `finish`ed; every byte comes back and
//!   the engine gives the device everything back when dropped.
//!
//! What shuttle cannot model here: a thread that panics fails the whole shuttle run, so the
//! reader's panic itself is tested with real threads
//! (`a_panicking_file_reader_fails_its_reads_instead_of_hanging` in
//! tests/rollback_failpoints.rs); the check here covers what the panic leads to, a group
//! dropped unserved. The mechanism crate's own threads (the file store's I/O pool) and locks
//! (the simulated device's) are std: to shuttle each call into them is one indivisible step,
//! and the file store's real threads are not explored. A real GPU's asynchrony is modelled
//! only as far as the simulated device's timings go.

use crate::fence::{after_all, EventPool, Fence};
use crate::file_reads::{FileReader, ReadGroup};
use crate::sync::{mpsc, thread, Arc, AtomicBool, Mutex, Ordering};
use crate::Error;
use std::collections::HashSet;
use tiermem_mechanism::file_store::{FileSlot, FileStore, FileStoreConfig, IoChoice};
use tiermem_mechanism::sim::{SimDevice, Timing, SIM_GRANULARITY};
use tiermem_mechanism::{
    ChunkLocation, Device, DeviceInfo, DevicePtr, EventHandle, HostPtr, PhysHandle, Result, StreamHandle,
    StreamPriority,
};

/// Schedules tried by each of the two schedulers, per check and device timing (fewer for
/// the whole engine, whose runs open a file tier each and take ~30 ms).
const SCHEDULES: usize = 300;
const ENGINE_SCHEDULES: usize = 60;
/// Preemptions `check_pct` places per schedule.
const PCT_DEPTH: usize = 3;

const G: usize = SIM_GRANULARITY;

/// Runs `scenario` under the random and the PCT scheduler, on a simulated device of each
/// timing: eager (copies done almost at once), lazy (done only when waited for, so that a
/// missing wait shows every time) and random (done late, in bursts).
fn check(schedules: usize, scenario: impl Fn(Timing) + Send + Sync + Clone + 'static) {
    for timing in Timing::ALL {
        let run = scenario.clone();
        shuttle::check_random(move || run(timing), schedules);
        let run = scenario.clone();
        shuttle::check_pct(move || run(timing), schedules, PCT_DEPTH);
    }
}

/// The simulated device with a scheduling point before every call (a driver call takes
/// time: other threads run meanwhile), and a ledger of events that fails the run on an event
/// used or destroyed after it was destroyed — which the event pool's drop would ignore.
struct ModelDevice {
    sim: SimDevice,
    ledger: std::sync::Mutex<Ledger>,
}

#[derive(Default)]
struct Ledger {
    live: HashSet<EventHandle>,
    created: usize,
}

impl ModelDevice {
    fn new(chunks: usize, timing: Timing) -> Arc<Self> {
        let sim = SimDevice::new(chunks * G).expect("simulated device");
        sim.set_timing(timing);
        Arc::new(Self { sim, ledger: std::sync::Mutex::default() })
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    #[track_caller]
    fn assert_live(&self, event: EventHandle) {
        assert!(self.ledger().live.contains(&event), "event {event:?} used after it was destroyed");
    }

    /// Asserts that every event made was destroyed and the device got everything back.
    #[track_caller]
    fn assert_all_returned(&self) {
        assert!(self.ledger().live.is_empty(), "events never destroyed: {:?}", self.ledger().live);
        assert!(self.sim.live().is_empty(), "still held: {:?}", self.sim.live());
    }
}

/// Forwards `Device` methods to the simulated device after a scheduling point.
macro_rules! forward {
    ($(fn $name:ident(&self $(, $arg:ident: $ty:ty)*) -> $ret:ty;)*) => {
        $(fn $name(&self $(, $arg: $ty)*) -> $ret {
            thread::yield_now();
            self.sim.$name($($arg),*)
        })*
    };
}

impl Device for ModelDevice {
    forward! {
        fn mem_info(&self) -> Result<(usize, usize)>;
        fn reserve(&self, size: usize) -> Result<DevicePtr>;
        fn unreserve(&self, va: DevicePtr, size: usize) -> Result<()>;
        fn create_chunk_at(&self, location: ChunkLocation) -> Result<PhysHandle>;
        fn release_chunk(&self, chunk: PhysHandle) -> Result<()>;
        fn release_mapped_chunk(&self, chunk: PhysHandle) -> Result<()>;
        fn create_chunks_at(&self, location: ChunkLocation, granules: usize) -> Result<PhysHandle>;
        fn map_sized(&self, va: DevicePtr, chunk: PhysHandle, size: usize) -> Result<()>;
        fn map(&self, va: DevicePtr, chunk: PhysHandle) -> Result<()>;
        fn set_access_from(&self, va: DevicePtr, size: usize, gpus: &[usize]) -> Result<()>;
        fn unmap(&self, va: DevicePtr, size: usize) -> Result<()>;
        fn alloc_pinned(&self, size: usize) -> Result<HostPtr>;
        fn free_pinned(&self, ptr: HostPtr, size: usize) -> Result<()>;
        fn create_stream(&self, priority: StreamPriority) -> Result<StreamHandle>;
        fn destroy_stream(&self, stream: StreamHandle) -> Result<()>;
        fn synchronize_stream(&self, stream: StreamHandle) -> Result<()>;
        fn elapsed_ms(&self, start: EventHandle, end: EventHandle) -> Result<f32>;
        fn copy_between_devices_async(&self, dst: DevicePtr, src: DevicePtr, len: usize, stream: StreamHandle) -> Result<()>;
        fn memset_async(&self, dst: DevicePtr, value: u8, len: usize, stream: StreamHandle) -> Result<()>;
        fn fill_pattern_async(&self, dst: DevicePtr, words: usize, seed: u64, first: u64, stream: StreamHandle) -> Result<()>;
        fn check_pattern_async(&self, src: DevicePtr, words: usize, seed: u64, first: u64, counter: DevicePtr, stream: StreamHandle) -> Result<()>;
        fn write(&self, dst: DevicePtr, src: &[u8]) -> Result<()>;
        fn read(&self, src: DevicePtr, dst: &mut [u8]) -> Result<()>;
        fn alloc_plain(&self, size: usize) -> Result<DevicePtr>;
        fn free_plain(&self, ptr: DevicePtr) -> Result<()>;
    }

    fn info(&self) -> &DeviceInfo {
        self.sim.info()
    }

    fn create_event(&self, timing: bool) -> Result<EventHandle> {
        thread::yield_now();
        let event = self.sim.create_event(timing)?;
        let mut ledger = self.ledger();
        ledger.live.insert(event);
        ledger.created += 1;
        Ok(event)
    }

    fn destroy_event(&self, event: EventHandle) -> Result<()> {
        thread::yield_now();
        assert!(self.ledger().live.remove(&event), "event {event:?} destroyed twice");
        self.sim.destroy_event(event)
    }

    fn record_event(&self, event: EventHandle, stream: StreamHandle) -> Result<()> {
        thread::yield_now();
        self.assert_live(event);
        self.sim.record_event(event, stream)
    }

    fn stream_wait_event(&self, stream: StreamHandle, event: EventHandle) -> Result<()> {
        thread::yield_now();
        self.assert_live(event);
        self.sim.stream_wait_event(stream, event)
    }

    fn event_done(&self, event: EventHandle) -> Result<bool> {
        thread::yield_now();
        self.assert_live(event);
        self.sim.event_done(event)
    }

    fn synchronize_event(&self, event: EventHandle) -> Result<()> {
        thread::yield_now();
        self.assert_live(event);
        self.sim.synchronize_event(event)
    }

    unsafe fn copy_to_device_async(
        &self,
        dst: DevicePtr,
        src: HostPtr,
        len: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        thread::yield_now();
        // SAFETY: forwarded from our caller, under the same contract.
        unsafe { self.sim.copy_to_device_async(dst, src, len, stream) }
    }

    unsafe fn copy_to_host_async(&self, dst: HostPtr, src: DevicePtr, len: usize, stream: StreamHandle) -> Result<()> {
        thread::yield_now();
        // SAFETY: forwarded from our caller, under the same contract.
        unsafe { self.sim.copy_to_host_async(dst, src, len, stream) }
    }
}

fn as_device(device: &Arc<ModelDevice>) -> Arc<dyn Device> {
    Arc::clone(device) as Arc<dyn Device>
}

fn failure() -> Error {
    Error::Config("model: the read failed".into())
}

/// A later fence recorded (or failed) by one thread while four others need it.
fn later_fence_scenario(fails: bool, timing: Timing) {
    let device = ModelDevice::new(1, timing);
    let stream = device.create_stream(StreamPriority::High).unwrap();
    let fence = EventPool::new(as_device(&device)).later().unwrap();
    // Set just before the record or failure begins: nothing may look done before.
    let settling = Arc::new(AtomicBool::new(false));
    let expected = if fails { Err(failure()) } else { Ok(()) };
    let spawn = |body: fn(&Fence, &AtomicBool, &Result<(), Error>)| {
        let (fence, settling, expected) = (Arc::clone(&fence), Arc::clone(&settling), expected.clone());
        thread::spawn(move || body(&fence, &settling, &expected))
    };
    let threads = [
        spawn(|fence, settling, expected| {
            assert_eq!(&fence.recorded(), expected, "recorded() must report the outcome");
            assert!(settling.load(Ordering::SeqCst), "recorded() returned before the record");
        }),
        spawn(|fence, settling, expected| {
            assert_eq!(&fence.recorded(), expected, "every waiter sees the outcome");
            assert!(settling.load(Ordering::SeqCst));
        }),
        spawn(|fence, settling, _| {
            let _ = fence.event();
            assert!(settling.load(Ordering::SeqCst), "event() returned an event not yet recorded");
        }),
        spawn(|fence, settling, _| {
            for _ in 0..3 {
                if fence.is_done().unwrap() {
                    assert!(settling.load(Ordering::SeqCst), "is_done() said true before the record");
                }
                thread::yield_now();
            }
            fence.wait().unwrap();
            assert!(settling.load(Ordering::SeqCst), "wait() returned before the record");
            assert!(fence.is_done().unwrap(), "done once waited for");
        }),
    ];
    settling.store(true, Ordering::SeqCst);
    match fails {
        true => fence.fail(failure()),
        false => fence.record_later(stream).unwrap(),
    }
    for thread in threads {
        thread.join().unwrap();
    }
    drop(fence);
    device.destroy_stream(stream).unwrap();
    device.assert_all_returned();
}

#[test]
fn a_recorded_later_fence_wakes_every_waiter_and_is_never_done_early() {
    check(SCHEDULES, |timing| later_fence_scenario(false, timing));
}

#[test]
fn a_failed_later_fence_reports_its_error_to_every_waiter() {
    check(SCHEDULES, |timing| later_fence_scenario(true, timing));
}

/// Events held by live fences, to check that no event serves two at once.
type Held = Arc<std::sync::Mutex<HashSet<EventHandle>>>;

/// Claims `fence`'s event until `unclaim`, called just before the fence is dropped.
fn claim(held: &Held, fence: &Arc<Fence>) -> EventHandle {
    let event = fence.event();
    let fresh = held.lock().unwrap().insert(event);
    assert!(fresh, "event {event:?} handed to two live fences");
    event
}

fn unclaim(held: &Held, event: EventHandle) {
    assert!(held.lock().unwrap().remove(&event));
}

#[test]
fn the_event_pool_never_shares_an_event_and_destroys_each_once() {
    const THREADS: usize = 3;
    // Each thread holds at most three fences at once: two recorded and one combining them.
    const MOST_LIVE: usize = 3 * THREADS;
    check(SCHEDULES, |timing| {
        let device = ModelDevice::new(1, timing);
        let pool = EventPool::new(as_device(&device));
        let held = Held::default();
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let (device, pool, held) = (Arc::clone(&device), Arc::clone(&pool), Arc::clone(&held));
                thread::spawn(move || {
                    let stream = device.create_stream(StreamPriority::High).unwrap();
                    for round in 0..2 {
                        let a = pool.record(stream).unwrap();
                        let ea = claim(&held, &a);
                        let b = pool.record(stream).unwrap();
                        let eb = claim(&held, &b);
                        let both = after_all(&pool, stream, &[Arc::clone(&a), Arc::clone(&b)]).unwrap();
                        // A fence of its own only when it is neither `a` nor `b`.
                        let own = both.filter(|f| !Arc::ptr_eq(f, &a) && !Arc::ptr_eq(f, &b));
                        let eo = own.as_ref().map(|f| claim(&held, f));
                        // Half the threads drop `a` first, half last.
                        let mut a = Some(a);
                        if (t + round) % 2 == 0 {
                            unclaim(&held, ea);
                            a = None;
                        }
                        if let (Some(f), Some(e)) = (own, eo) {
                            f.wait().unwrap();
                            unclaim(&held, e);
                        }
                        // A later fence that is failed and dropped: its event, never recorded,
                        // is reused all the same.
                        let later = pool.later().unwrap();
                        later.fail(failure());
                        let el = claim(&held, &later);
                        unclaim(&held, el);
                        drop(later);
                        unclaim(&held, eb);
                        drop(b);
                        if let Some(a) = a {
                            unclaim(&held, ea);
                            drop(a);
                        }
                    }
                    device.synchronize_stream(stream).unwrap();
                    device.destroy_stream(stream).unwrap();
                })
            })
            .collect();
        // The last fence dropped, in whichever thread, drops the pool.
        drop(pool);
        for thread in threads {
            thread.join().unwrap();
        }
        let created = device.ledger().created;
        assert!(created <= MOST_LIVE, "{created} events made for at most {MOST_LIVE} fences live at once");
        device.assert_all_returned();
    });
}

/// A group's fence dropped unserved — the reader thread panicked while reading it, or died
/// with it queued — wakes its waiters with an error instead of leaving them blocked.
#[test]
fn a_read_group_dropped_unserved_fails_its_fence() {
    check(SCHEDULES, |timing| {
        let device = ModelDevice::new(1, timing);
        let pool = EventPool::new(as_device(&device));
        let (in_hand, queued) = (pool.later().unwrap(), pool.later().unwrap());
        let (queue, groups) = mpsc::channel();
        for fence in [&in_hand, &queued] {
            queue.send(ReadGroup { call: "model", items: Vec::new(), fence: Arc::clone(fence) }).unwrap();
        }
        let waiters: Vec<_> = [&in_hand, &queued, &in_hand]
            .into_iter()
            .map(|fence| {
                let fence = Arc::clone(fence);
                thread::spawn(move || {
                    let err = fence.recorded().expect_err("a group dropped unserved fails its fence");
                    assert!(err.to_string().starts_with("configuration: model: "), "{err}");
                    fence.wait().unwrap();
                    assert!(fence.is_done().unwrap());
                })
            })
            .collect();
        // The reader takes one group and dies without serving it (shuttle cannot let a thread
        // panic: it drops it, as unwinding would), its queue with it.
        let reader = thread::spawn(move || drop(groups.recv().unwrap()));
        reader.join().unwrap();
        drop(queue);
        for waiter in waiters {
            waiter.join().unwrap();
        }
        drop((in_hand, queued, pool));
        device.assert_all_returned();
    });
}

/// Slots of the file store the reader reads from.
const SLOTS: usize = 2;

fn pattern(seed: usize) -> Vec<u8> {
    (0..G).map(|i| (i * 131 + seed * 7 + (i >> 12)) as u8).collect()
}

/// A file store holding `pattern(s)` in each slot `s`, shared by every run of a check (its
/// I/O threads are std threads, not modelled).
fn store_with_patterns() -> Arc<FileStore> {
    let dir = std::env::var_os("TIERMEM_TEST_FILE_DIR").map_or_else(std::env::temp_dir, Into::into);
    let store = FileStore::open(FileStoreConfig {
        path: dir.join(format!("tiermem-model-checks-{}", std::process::id())),
        capacity: SLOTS * G,
        slot_size: G,
        queue_depth: 2,
        io: IoChoice::Threads,
    })
    .expect("a file store for the model checks (set TIERMEM_TEST_FILE_DIR to a directory allowing O_DIRECT)");
    let slots = store.alloc(SLOTS).unwrap();
    assert_eq!(slots, (0..SLOTS as u32).map(FileSlot).collect::<Vec<_>>());
    let align = store.alignment().0.max(4096);
    let mut raw = vec![0u8; G + align];
    let at = raw.as_ptr().align_offset(align);
    for slot in slots {
        raw[at..at + G].copy_from_slice(&pattern(slot.0 as usize));
        // SAFETY: the source is `G` (one slot) bytes inside `raw`, aligned to the store's
        // memory alignment, and nothing writes `raw` until the call returns.
        unsafe { store.write(&[(slot, raw[at..].as_ptr())]) }.unwrap();
    }
    Arc::new(store)
}

#[test]
fn the_file_reader_serves_or_fails_every_group_and_stops_cleanly() {
    // (slot, chunk) pairs. Chunks 0 and 1 get slots 0 and 1 in groups of one; chunks 2 and 3
    // slots 1 and 0 in one group, which needs the whole staging area (two slots) and so waits
    // for the copies out of it before — reading over one too early would change its bytes.
    const GROUPS: [&[(usize, usize)]; 3] = [&[(0, 0)], &[(1, 1)], &[(1, 2), (0, 3)]];
    let store = store_with_patterns();
    check(SCHEDULES, move |timing| {
        let device = ModelDevice::new(4, timing);
        let va = device.reserve(4 * G).unwrap();
        let chunks: Vec<PhysHandle> = (0..4).map(|_| device.create_chunk().unwrap()).collect();
        for (i, &chunk) in chunks.iter().enumerate() {
            device.map(va + (i * G) as u64, chunk).unwrap();
        }
        device.set_access(va, 4 * G).unwrap();
        let pool = EventPool::new(as_device(&device));
        let reader = FileReader::start(as_device(&device), Arc::clone(&store), 1).unwrap();
        let reader = Arc::new(Mutex::new(reader));
        let submitters: Vec<_> = GROUPS
            .iter()
            .map(|&group| {
                let (device, pool, reader) = (Arc::clone(&device), Arc::clone(&pool), Arc::clone(&reader));
                thread::spawn(move || {
                    let fence = pool.later().unwrap();
                    let items = group.iter().map(|&(slot, chunk)| (FileSlot(slot as u32), va + (chunk * G) as u64));
                    let items = items.collect();
                    reader.lock().unwrap().submit(ReadGroup { call: "model", items, fence: Arc::clone(&fence) });
                    match fence.recorded() {
                        Ok(()) => {
                            fence.wait().unwrap();
                            for &(slot, chunk) in group {
                                let mut back = vec![0u8; G];
                                device.read(va + (chunk * G) as u64, &mut back).unwrap();
                                assert!(back == pattern(slot), "chunk {chunk} does not hold slot {slot}");
                            }
                        }
                        Err(e) => assert!(e.to_string().contains("file reader thread has stopped"), "{e}"),
                    }
                })
            })
            .collect();
        reader.lock().unwrap().stop();
        for submitter in submitters {
            submitter.join().unwrap();
        }
        let live = device.sim.live();
        assert_eq!((live.pinned_bytes, live.streams), (0, 0), "the stopped reader kept its staging or stream");
        drop(reader);
        device.unmap(va, 4 * G).unwrap();
        chunks.into_iter().for_each(|chunk| device.release_chunk(chunk).unwrap());
        device.unreserve(va, 4 * G).unwrap();
        drop(pool);
        device.assert_all_returned();
    });
}

/// A fresh path for a file tier, in `TIERMEM_TEST_FILE_DIR` or the temporary directory.
fn file_tier_path() -> std::path::PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir = std::env::var_os("TIERMEM_TEST_FILE_DIR").map_or_else(std::env::temp_dir, Into::into);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    dir.join(format!("tiermem-model-engine-{}-{n}", std::process::id()))
}

/// A whole engine with a file tier: one thread pages a buffer in from the file and finishes,
/// one pages another out to the file in the background and finishes, one acquires the first
/// while its read may still be queued. Every byte comes back, nothing deadlocks on the
/// engine lock, and dropping the engine gives everything back.
#[test]
fn the_engine_pages_through_the_file_from_several_threads() {
    let patterns: Arc<Vec<Vec<u8>>> = Arc::new((0..3).map(pattern).collect());
    check(ENGINE_SCHEDULES, move |timing| {
        let device = ModelDevice::new(8, timing);
        let config = crate::EngineConfig {
            hbm_limit: Some(4 * G),
            host_limit: Some(2 * G),
            batch_chunks: 1,
            file: Some(file_tier_path()),
            file_limit: 8 * G,
            file_io: IoChoice::Threads,
            file_queue_depth: 2,
            chunk: Some(G),
            ..crate::EngineConfig::default()
        };
        let engine = Arc::new(crate::Engine::with_device(as_device(&device), &config).unwrap());
        let (a, _) = engine.alloc(2 * G, crate::AllocOptions::default()).unwrap();
        engine.write(a, 0, &patterns[0]).unwrap();
        engine.write(a, G, &patterns[1]).unwrap();
        engine.page_out_to_file(crate::Target::Buffer(a)).unwrap();
        let (b, _) = engine.alloc(G, crate::AllocOptions::default()).unwrap();
        engine.write(b, 0, &patterns[2]).unwrap();
        let patterns = Arc::clone(&patterns);
        let expect = move |engine: &crate::Engine, buffer, chunks: &[usize]| {
            for (i, &p) in chunks.iter().enumerate() {
                let mut back = vec![0u8; G];
                engine.read(buffer, i * G, &mut back).unwrap();
                assert!(back == patterns[p], "chunk {i} of {buffer:?} changed");
            }
        };
        let spawn = |body: Box<dyn FnOnce(&crate::Engine) + Send>| {
            let engine = Arc::clone(&engine);
            thread::spawn(move || body(&engine))
        };
        let (expect_a, expect_b) = (expect.clone(), expect.clone());
        let threads = [
            spawn(Box::new(move |engine| {
                let ticket = engine.page_in_start(crate::Target::Buffer(a)).unwrap();
                engine.finish(ticket).unwrap();
                expect_a(engine, a, &[0, 1]);
            })),
            spawn(Box::new(move |engine| {
                let ticket = engine.page_out_to_file_start(crate::Target::Buffer(b)).unwrap();
                engine.finish(ticket).unwrap();
                expect_b(engine, b, &[2]);
            })),
            spawn(Box::new(move |engine| {
                let whole = [crate::Region::whole(a)];
                engine.acquire(&whole, crate::Access::ReadOnly, StreamHandle(0)).unwrap();
                engine.release(&whole, StreamHandle(0)).unwrap();
            })),
        ];
        for thread in threads {
            thread.join().unwrap();
        }
        expect(&engine, a, &[0, 1]);
        drop(Arc::into_inner(engine).expect("every thread is done with the engine"));
        device.assert_all_returned();
    });
}
