//! Every documented error of the public API, with its exact variant and a message that names
//! the call; and after every error, every byte written before reads back unchanged and no
//! chunk is left acquired ("an operation that returns an error has changed nothing the caller
//! can observe").
//!
//! The world: an HBM cap of 4 chunks, a host tier of 8, and two buffers with known contents
//! that together need 5 chunks (so one of them always lives partly on the host).

mod support;

use support::{acquired_chunks, assert_contents, buffer_stats, fill, CHUNK};
use tiermem::{Access, AllocOptions, BufferId, Engine, Error, Region, StreamHandle, Target, Ticket};

const HBM: usize = 4;
const HOST: usize = 8;
const S: StreamHandle = StreamHandle(0);

struct World {
    engine: Engine,
    sim: Option<std::sync::Arc<tiermem::mechanism::sim::SimDevice>>,
    /// Buffers and the bytes they must hold.
    bufs: Vec<(BufferId, Vec<u8>)>,
}

impl World {
    fn new() -> Self {
        let (engine, sim) = support::engine(HBM, HOST, support::config());
        let mut world = World { engine, sim, bufs: Vec::new() };
        world.add(5 * CHUNK / 2, 11, AllocOptions::default()); // 3 chunks, the last partial
        world.add(CHUNK + 100, 12, AllocOptions::default()); // 2 chunks
        world
    }

    fn add(&mut self, size: usize, seed: u64, options: AllocOptions) -> BufferId {
        let (id, _) = self.engine.alloc(size, options).expect("alloc");
        let bytes = fill(&self.engine, id, size, seed);
        self.bufs.push((id, bytes));
        id
    }

    fn id(&self, i: usize) -> BufferId {
        self.bufs[i].0
    }

    fn size(&self, i: usize) -> usize {
        self.bufs[i].1.len()
    }

    /// Nothing acquired, every byte as written.
    fn check(&self) {
        assert_eq!(acquired_chunks(&self.engine), 0, "an error left chunks acquired: {}", self.engine.stats());
        for (id, bytes) in &self.bufs {
            assert_contents(&self.engine, *id, bytes);
        }
    }

    fn finish(self) {
        self.check();
        support::assert_no_leaks(self.engine, self.sim);
    }
}

#[test]
fn alloc_of_zero_bytes_is_zero_size() {
    let w = World::new();
    let before = w.engine.stats().buffers.len();
    let e = w.engine.alloc(0, AllocOptions::default()).unwrap_err();
    assert_eq!(e, Error::ZeroSize { call: "alloc" });
    assert!(e.to_string().starts_with("alloc:"), "{e}");
    assert_eq!(w.engine.stats().buffers.len(), before, "a zero-size alloc created a buffer");
    w.finish();
}

#[test]
fn alloc_beyond_both_tiers_is_out_of_memory_and_reserves_nothing() {
    let w = World::new();
    let reservations = w.sim.as_ref().map(|s| s.live().reservations);
    let too_big = (HBM + HOST) * CHUNK + 1;
    let e = w.engine.alloc(too_big, AllocOptions::default()).unwrap_err();
    assert!(matches!(&e, Error::OutOfMemory { call: "alloc", .. }), "{e:?}");
    assert!(e.to_string().starts_with("alloc: out of memory"), "{e}");
    assert!(e.to_string().contains(&too_big.to_string()), "the message should give the size: {e}");
    assert_eq!(w.sim.as_ref().map(|s| s.live().reservations), reservations, "a refused alloc reserved VA");
    assert_eq!(w.engine.stats().buffers.len(), 2);
    w.check();
    // Exactly both tiers is allowed (the bytes are not touched, so nothing has to fit yet).
    let (id, _) = w.engine.alloc((HBM + HOST) * CHUNK, AllocOptions::default()).expect("alloc of both tiers");
    w.engine.free(id).unwrap();
    w.finish();
}

#[test]
fn double_free_is_unknown_buffer_naming_free() {
    let w = World::new();
    let a = w.id(0);
    w.engine.free(a).expect("first free");
    let e = w.engine.free(a).unwrap_err();
    assert_eq!(e, Error::UnknownBuffer { call: "free", buffer: a });
    assert!(e.to_string().starts_with("free:"), "{e}");
    // A never-allocated id too.
    let ghost = BufferId(9_999);
    assert_eq!(w.engine.free(ghost), Err(Error::UnknownBuffer { call: "free", buffer: ghost }));
    // The other buffer is untouched.
    let World { engine, sim, mut bufs } = w;
    bufs.remove(0);
    World { engine, sim, bufs }.finish();
}

#[test]
fn every_call_on_a_freed_buffer_is_unknown_buffer_naming_the_call() {
    let w = World::new();
    let (a, b) = (w.id(0), w.id(1));
    w.engine.free(a).unwrap();
    let e = &w.engine;
    let whole = [Region::whole(a)];
    let mut out = [0u8; 8];
    let cases: Vec<(&str, Result<(), Error>)> = vec![
        ("acquire", e.acquire(&whole, Access::ReadOnly, S)),
        ("acquire", e.acquire(&whole, Access::ReadWrite, S)),
        ("release", e.release(&whole, S)),
        ("write", e.write(a, 0, &[1, 2, 3])),
        ("read", e.read(a, 0, &mut out)),
        ("page_in", e.page_in(Target::Buffer(a))),
        ("page_out", e.page_out(Target::Buffer(a))),
        ("page_in", e.page_in_start(Target::Buffer(a)).map(|_| ())),
        ("page_out", e.page_out_start(Target::Buffer(a)).map(|_| ())),
        ("prefetch", e.prefetch(&whole)),
        ("device_ptr", e.device_ptr(a).map(|_| ())),
    ];
    for (call, result) in cases {
        let err = result.expect_err(call);
        assert_eq!(err, Error::UnknownBuffer { call, buffer: a });
        assert!(err.to_string().starts_with(&format!("{call}:")), "{err}");
        assert!(err.to_string().contains(&a.to_string()), "the message should name the buffer: {err}");
    }
    // A list with one live and one freed buffer pins nothing.
    let mixed = [Region::whole(b), Region::whole(a)];
    assert_eq!(e.acquire(&mixed, Access::ReadWrite, S), Err(Error::UnknownBuffer { call: "acquire", buffer: a }));
    assert_eq!(e.prefetch(&mixed), Err(Error::UnknownBuffer { call: "prefetch", buffer: a }));
    assert_eq!(acquired_chunks(e), 0);
    let World { engine, sim, mut bufs } = w;
    bufs.remove(0);
    World { engine, sim, bufs }.finish();
}

#[test]
fn regions_outside_a_buffer_are_out_of_range() {
    let w = World::new();
    let (a, b) = (w.id(0), w.id(1));
    let size = w.size(0);
    let e = &w.engine;
    let oor = |call: &'static str, offset: usize, len: usize| Error::OutOfRange { call, buffer: a, offset, len, size };
    let past_end = Region::bytes(a, size - 10, 11);
    let overflow = Region::bytes(a, usize::MAX, 1);
    let overflow_len = Region::bytes(a, 1, usize::MAX);
    let whole_past_end = Region { buffer: a, offset: size + 1, len: None };
    let zero_len = Region::bytes(a, 0, 0);
    for (region, offset, len) in [
        (past_end, size - 10, 11),
        (overflow, usize::MAX, 1),
        (overflow_len, 1, usize::MAX),
        (whole_past_end, size + 1, 0),
        (zero_len, 0, 0),
    ] {
        for access in [Access::ReadOnly, Access::ReadWrite] {
            assert_eq!(e.acquire(&[region], access, S), Err(oor("acquire", offset, len)), "{region:?}");
            // Also when a valid region comes first: nothing of it may stay pinned.
            assert_eq!(e.acquire(&[Region::whole(b), region], access, S), Err(oor("acquire", offset, len)));
        }
        assert_eq!(e.release(&[region], S), Err(oor("release", offset, len)), "{region:?}");
        assert_eq!(e.prefetch(&[region]), Err(oor("prefetch", offset, len)), "{region:?}");
        assert_eq!(acquired_chunks(e), 0, "{region:?}");
    }
    // Engine::write / read with the same kinds of bad ranges.
    let mut out = vec![0u8; 11];
    assert_eq!(e.write(a, size - 10, &[7; 11]), Err(oor("write", size - 10, 11)));
    assert_eq!(e.read(a, size - 10, &mut out), Err(oor("read", size - 10, 11)));
    assert_eq!(e.write(a, usize::MAX, &[7]), Err(oor("write", usize::MAX, 1)));
    assert_eq!(e.read(a, usize::MAX, &mut out[..1]), Err(oor("read", usize::MAX, 1)));
    assert_eq!(e.write(a, size, &[7]), Err(oor("write", size, 1)));
    let msg = e.read(a, size - 10, &mut out).unwrap_err().to_string();
    assert!(msg.starts_with("read:") && msg.contains(&size.to_string()), "{msg}");
    // The last byte is in range.
    e.read(a, size - 1, &mut out[..1]).unwrap();
    assert_eq!(out[0], w.bufs[0].1[size - 1]);
    w.finish();
}

#[test]
fn release_of_what_was_never_acquired_is_not_acquired() {
    let w = World::new();
    let a = w.id(0);
    let e = &w.engine;
    let err = e.release(&[Region::whole(a)], S).unwrap_err();
    assert_eq!(err, Error::NotAcquired { buffer: a, offset: 0, len: CHUNK });
    assert!(err.to_string().starts_with("release:"), "{err}");

    // Chunk 0 acquired, the whole buffer released: refused as a whole, chunk 0 stays acquired.
    e.acquire(&[Region::bytes(a, 0, 100)], Access::ReadWrite, S).unwrap();
    assert_eq!(e.release(&[Region::whole(a)], S), Err(Error::NotAcquired { buffer: a, offset: CHUNK, len: CHUNK }));
    assert_eq!(buffer_stats(e, a).acquired, 1, "a refused release changed the pins");
    e.release(&[Region::bytes(a, 0, 100)], S).unwrap();
    // Released twice.
    assert_eq!(e.release(&[Region::bytes(a, 0, 100)], S), Err(Error::NotAcquired { buffer: a, offset: 0, len: CHUNK }));
    w.finish();
}

#[test]
fn read_only_buffers_refuse_read_write_acquires_but_take_engine_writes() {
    let mut w = World::new();
    let size = CHUNK + 4096;
    let ro = w.add(size, 21, AllocOptions { read_only: true, ..AllocOptions::default() });
    let b = w.id(1);
    let e = &w.engine;
    let err = e.acquire(&[Region::whole(ro)], Access::ReadWrite, S).unwrap_err();
    assert_eq!(err, Error::ReadOnly { call: "acquire", buffer: ro });
    assert!(err.to_string().starts_with("acquire:"), "{err}");
    // Among other regions: nothing pinned.
    assert_eq!(
        e.acquire(&[Region::whole(b), Region::bytes(ro, 5, 5)], Access::ReadWrite, S),
        Err(Error::ReadOnly { call: "acquire", buffer: ro })
    );
    assert_eq!(acquired_chunks(e), 0);

    // Engine::write still loads it; the bytes are there, through Engine::read and on the device.
    let patch = support::pattern(22, 3000);
    e.write(ro, CHUNK - 1000, &patch).expect("Engine::write to a read-only buffer");
    w.bufs[2].1[CHUNK - 1000..CHUNK + 2000].copy_from_slice(&patch);
    let e = &w.engine;
    e.acquire(&[Region::whole(ro)], Access::ReadOnly, S).expect("ReadOnly acquire");
    let mut device_bytes = vec![0u8; size];
    e.device().read(e.device_ptr(ro).unwrap(), &mut device_bytes).unwrap();
    e.release(&[Region::whole(ro)], S).unwrap();
    assert!(device_bytes == w.bufs[2].1, "read-only buffer bytes differ on the device");
    w.finish();
}

#[test]
fn acquiring_more_than_the_hbm_cap_would_never_fit_and_pins_nothing() {
    let mut w = World::new();
    let big = w.add(5 * CHUNK, 31, AllocOptions::default());
    let (a, b) = (w.id(0), w.id(1));
    let e = &w.engine;
    assert_eq!(e.hbm_cap(), HBM * CHUNK);
    let want = Error::WouldNeverFit { call: "acquire", requested: 5 * CHUNK, cap: HBM * CHUNK };
    for access in [Access::ReadOnly, Access::ReadWrite] {
        let err = e.acquire(&[Region::whole(big)], access, S).unwrap_err();
        assert_eq!(err, want);
        assert!(err.to_string().starts_with("acquire:"), "{err}");
        // 3 + 2 chunks of two buffers.
        assert_eq!(e.acquire(&[Region::whole(a), Region::whole(b)], access, S), Err(want.clone()));
    }
    assert!(e.stats().buffers.iter().all(|s| s.acquired == 0), "{}", e.stats());
    assert!(
        matches!(e.page_in(Target::Buffer(big)), Err(Error::WouldNeverFit { requested, .. }) if requested == 5 * CHUNK)
    );
    assert!(matches!(e.page_in(Target::All), Err(Error::WouldNeverFit { .. })));
    // Four of its chunks fit exactly.
    e.acquire(&[Region::bytes(big, CHUNK, 4 * CHUNK)], Access::ReadOnly, S).expect("4 chunks fit");
    e.release(&[Region::bytes(big, CHUNK, 4 * CHUNK)], S).unwrap();
    w.finish();
}

#[test]
fn would_never_fit_names_the_call_that_failed() {
    let w = World::new();
    let (big, _) = w.engine.alloc(5 * CHUNK, AllocOptions::default()).unwrap();
    let page_in = w.engine.page_in(Target::Buffer(big)).unwrap_err().to_string();
    assert!(page_in.starts_with("page_in:"), "{page_in}");
}

#[test]
fn host_copies_of_more_than_the_cap_go_in_windows_and_a_failing_one_says_how_far_it_got() {
    let w = World::new();
    let e = &w.engine;
    e.free(w.id(1)).unwrap(); // room in the host tier for what the holds below push out
    let (big, _) = e.alloc(5 * CHUNK, AllocOptions::default()).unwrap();
    let data = support::pattern(9, 5 * CHUNK);
    e.write(big, 0, &data).expect("five chunks under a cap of four");
    let mut back = vec![0u8; 5 * CHUNK];
    e.read(big, 0, &mut back).unwrap();
    assert!(back == data);

    // Windows of the cap (four chunks) from the buffer's start: chunk 3, then chunk 4. With
    // chunk 3 and three others held, the second window has no room.
    let held = [Region::whole(w.id(0)), Region::bytes(big, 3 * CHUNK, CHUNK)];
    e.acquire(&held, Access::ReadOnly, S).unwrap();
    let new = support::pattern(10, 2 * CHUNK);
    match e.write(big, 3 * CHUNK, &new) {
        Err(Error::PartlyWritten { call: "write", written, source }) => {
            assert_eq!(written, CHUNK);
            assert!(matches!(*source, Error::OutOfMemory { call: "write", .. }), "{source}");
        }
        other => panic!("the second window cannot fit: {other:?}"),
    }
    let err = e.write(big, 3 * CHUNK, &new).unwrap_err().to_string();
    assert!(err.starts_with("write: only the first 2097152 bytes were written: write: out of memory"), "{err}");
    e.release(&held, S).unwrap();
    e.read(big, 0, &mut back).unwrap();
    assert!(back[3 * CHUNK..4 * CHUNK] == new[..CHUNK], "the first window was written");
    assert!(back[..3 * CHUNK] == data[..3 * CHUNK] && back[4 * CHUNK..] == data[4 * CHUNK..], "the rest is as before");
}

#[test]
fn acquiring_what_others_leave_no_room_for_is_out_of_memory() {
    let w = World::new();
    let (a, b) = (w.id(0), w.id(1));
    let e = &w.engine;
    e.acquire(&[Region::whole(a)], Access::ReadWrite, S).unwrap(); // 3 of 4 chunks
    let err = e.acquire(&[Region::whole(b)], Access::ReadOnly, S).unwrap_err();
    assert!(matches!(&err, Error::OutOfMemory { call: "acquire", .. }), "{err:?}");
    assert!(err.to_string().starts_with("acquire: out of memory"), "{err}");
    assert_eq!((buffer_stats(e, a).acquired, buffer_stats(e, b).acquired), (3, 0));
    // Through Engine::write / read / page_in, naming those calls.
    let err = e.write(b, 0, &vec![9u8; CHUNK + 100]).unwrap_err();
    assert!(matches!(&err, Error::OutOfMemory { call: "write", .. }), "{err:?}");
    let err = e.read(b, 0, &mut vec![0u8; CHUNK + 100]).unwrap_err();
    assert!(matches!(&err, Error::OutOfMemory { call: "read", .. }), "{err:?}");
    let err = e.page_in(Target::Buffer(b)).unwrap_err();
    assert!(matches!(&err, Error::OutOfMemory { call: "page_in", .. }), "{err:?}");
    assert!(err.to_string().starts_with("page_in:"), "{err}");
    assert_eq!((buffer_stats(e, a).acquired, buffer_stats(e, b).acquired), (3, 0));
    // One chunk of b still fits next to a.
    e.acquire(&[Region::bytes(b, 0, 10)], Access::ReadOnly, S).expect("the 4th chunk fits");
    e.release(&[Region::bytes(b, 0, 10)], S).unwrap();
    // Prefetch never evicts and never fails for lack of room.
    e.prefetch(&[Region::whole(b)]).expect("prefetch into a full HBM");
    e.release(&[Region::whole(a)], S).unwrap();
    w.finish();
}

#[test]
fn a_chunk_acquired_twice_takes_one_chunk_of_hbm() {
    let w = World::new();
    let (a, b) = (w.id(0), w.id(1));
    let e = &w.engine;
    // One chunk of b, acquired twice (nested acquires are allowed: pins count).
    let one = [Region::bytes(b, 0, 10)];
    e.acquire(&one, Access::ReadOnly, S).unwrap();
    e.acquire(&one, Access::ReadOnly, S).unwrap();
    assert_eq!(buffer_stats(e, b).acquired, 1);
    // 1 + 3 distinct chunks = the cap of 4: this fits.
    e.acquire(&[Region::whole(a)], Access::ReadOnly, S).expect("3 more chunks next to 1 pinned chunk");
    e.release(&[Region::whole(a)], S).unwrap();
    e.release(&one, S).unwrap();
    e.release(&one, S).unwrap();
    w.finish();
}

#[test]
fn acquired_buffers_cannot_be_freed_or_paged_out() {
    let w = World::new();
    let (a, b) = (w.id(0), w.id(1));
    let e = &w.engine;
    e.acquire(&[Region::bytes(a, CHUNK, CHUNK + 1)], Access::ReadWrite, S).unwrap(); // chunks 1 and 2
    let err = e.free(a).unwrap_err();
    assert_eq!(err, Error::Acquired { call: "free", buffer: a, pinned_chunks: 2 });
    assert!(err.to_string().starts_with("free:"), "{err}");
    let err = e.page_out(Target::Buffer(a)).unwrap_err();
    assert_eq!(err, Error::Acquired { call: "page_out", buffer: a, pinned_chunks: 2 });
    assert!(err.to_string().starts_with("page_out:"), "{err}");
    assert_eq!(
        e.page_out_start(Target::Buffer(a)).map(|_| ()),
        Err(Error::Acquired { call: "page_out", buffer: a, pinned_chunks: 2 })
    );
    assert_eq!(e.page_out(Target::All), Err(Error::Acquired { call: "page_out", buffer: a, pinned_chunks: 2 }));
    assert_eq!(buffer_stats(e, a).acquired, 2);
    assert_eq!(buffer_stats(e, a).in_hbm, 2, "chunks of an acquired buffer left HBM");
    // The other buffer can still be paged out.
    e.page_out(Target::Buffer(b)).expect("page_out of an unacquired buffer");
    e.release(&[Region::bytes(a, CHUNK, CHUNK + 1)], S).unwrap();
    e.page_out(Target::All).expect("page_out once released");
    w.finish();
}

#[test]
fn exchange_refuses_a_buffer_both_ways_and_an_acquired_outgoing_one() {
    let w = World::new();
    let (a, b) = (w.id(0), w.id(1));
    let e = &w.engine;
    let err = e.exchange(Target::Buffer(a), Target::Buffer(a)).unwrap_err();
    assert_eq!(err, Error::Conflict { call: "exchange", buffer: a });
    assert!(err.to_string().starts_with("exchange:"), "{err}");
    assert!(matches!(e.exchange(Target::All, Target::Buffer(b)), Err(Error::Conflict { .. })));
    e.acquire(&[Region::whole(a)], Access::ReadOnly, S).unwrap();
    let err = e.exchange(Target::Buffer(a), Target::Buffer(b)).unwrap_err();
    assert!(matches!(err, Error::Acquired { call: "exchange", buffer, .. } if buffer == a), "{err}");
    e.release(&[Region::whole(a)], S).unwrap();
    w.check();
    e.exchange(Target::Buffer(a), Target::Buffer(b)).expect("exchange once released");
    assert_eq!(buffer_stats(e, a).in_hbm, 0, "the outgoing buffer left HBM");
    assert_eq!(buffer_stats(e, b).in_hbm, buffer_stats(e, b).chunks, "the incoming buffer is resident");
    w.finish();
}

#[test]
fn finish_of_an_unknown_ticket_is_unknown_ticket() {
    let w = World::new();
    let e = &w.engine;
    let err = e.finish(Ticket(12_345)).unwrap_err();
    assert_eq!(err, Error::UnknownTicket { call: "finish", ticket: 12_345 });
    assert!(err.to_string().starts_with("finish:"), "{err}");
    let ticket = e.page_out_start(Target::Buffer(w.id(0))).unwrap();
    e.finish(ticket).expect("first finish");
    assert_eq!(e.finish(ticket), Err(Error::UnknownTicket { call: "finish", ticket: ticket.0 }));
    w.finish();
}
