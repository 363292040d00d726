"""The Python API on the simulated device (CI has no GPU): bytes round-trip through buffers
under memory pressure, errors are tiermem exceptions that change nothing, stats are a dict."""

import os

import pytest

import tiermem

CHUNK = 4 << 20  # the default chunk: two granules of the (simulated) device


@pytest.fixture
def pool():
    return tiermem.Pool(backend="sim", hbm_limit=4 * CHUNK, host_limit="64MiB", policy="lru")


def pattern(seed: int, size: int) -> bytes:
    return bytes((i * 31 + seed * 7 + (i >> 12)) & 0xFF for i in range(size))


def test_pool_reports_what_it_runs_on(pool):
    assert pool.backend == "sim"
    assert pool.hbm_cap == 4 * CHUNK
    assert pool.chunk_size == CHUNK
    assert pool.policy == "lru"
    assert "sim" in repr(pool)


def test_the_chunk_is_whole_granules_and_a_bad_one_is_a_clear_error():
    assert tiermem.Pool(backend="sim", hbm_limit="16MiB", chunk="2MiB").chunk_size == 2 << 20
    assert tiermem.Pool(backend="sim", hbm_limit="16MiB", chunk=3 << 20).chunk_size == CHUNK, "rounded up to granules"
    with pytest.raises(tiermem.TiermemError, match="chunk"):
        tiermem.Pool(backend="sim", hbm_limit="16MiB", chunk="2GiB")
    with pytest.raises(tiermem.InvalidArgumentError, match="chunk"):
        tiermem.Pool(backend="sim", chunk="big")


def test_bytes_survive_a_working_set_twice_the_hbm_cap(pool):
    buffers = [pool.alloc(2 * CHUNK, name=f"b{i}") for i in range(4)]
    data = [pattern(i, 2 * CHUNK) for i in range(4)]
    for buf, d in zip(buffers, data):
        buf.write(d)
    for round_ in range(2):
        for buf in buffers:
            with pool.acquired([buf], write=round_ == 0):
                pass
    pool.page_out()
    for buf, d in zip(buffers, data):
        assert buf.read() == d
    stats = pool.stats()
    assert stats["transfers"]["page_outs"] > 0 and stats["transfers"]["page_ins"] > 0
    assert [b["name"] for b in stats["buffers"]] == ["b0", "b1", "b2", "b3"]
    assert stats["hbm"]["capacity_bytes"] == 4 * CHUNK


def test_ranges_and_offsets(pool):
    buf = pool.alloc(3 * CHUNK + 100)
    assert buf.read(16, offset=3 * CHUNK) == bytes(16), "never-written bytes read as zeros"
    buf.write(b"tiermem", offset=CHUNK - 3)
    assert buf.read(7, offset=CHUNK - 3) == b"tiermem"
    pool.acquire([(buf, CHUNK, 10)], write=True)
    pool.release([(buf, CHUNK, 10)])
    with pytest.raises(tiermem.InvalidArgumentError, match="outside buffer"):
        pool.acquire([(buf, 3 * CHUNK, 200)])


def test_errors_are_tiermem_exceptions_that_change_nothing(pool):
    buf = pool.alloc(CHUNK)
    buf.write(b"x" * 100)
    with pytest.raises(tiermem.WouldNeverFitError, match="acquire"):
        pool.acquire([pool.alloc(5 * CHUNK)])
    with pytest.raises(tiermem.BufferStateError, match="not acquired"):
        pool.release([buf])
    with pytest.raises(tiermem.InvalidArgumentError, match="size"):
        pool.alloc(0)
    with pytest.raises(tiermem.InvalidArgumentError):
        pool.alloc("lots")
    ro = pool.alloc(CHUNK, read_only=True)
    ro.write(b"weights")
    with pytest.raises(tiermem.BufferStateError, match="read-only"):
        pool.acquire([ro], write=True)
    with pool.acquired([buf]):
        with pytest.raises(tiermem.BufferStateError, match="acquired"):
            buf.free()
    buf.free()
    with pytest.raises(tiermem.BufferStateError, match="already freed"):
        buf.free()
    with pytest.raises(tiermem.BufferStateError, match="does not exist"):
        buf.read(1)
    assert ro.read(7) == b"weights"
    for size, offset in [(2**63, 0), (2**64 - 1, 0), (1, 2**64 - 1), (CHUNK + 1, 0)]:
        with pytest.raises(tiermem.InvalidArgumentError, match=r"read: range .* is outside buffer"):
            ro.read(size, offset=offset)  # refused before anything is allocated
    assert all(isinstance(e, type) and issubclass(e, tiermem.TiermemError) for e in (
        tiermem.OutOfMemoryError, tiermem.DeviceError, tiermem.FileTierError))


def test_parts_lie_side_by_side_keep_their_bytes_and_bad_sizes_are_refused(pool):
    parts = pool.alloc_parts([3 * CHUNK, CHUNK + 5, CHUNK], name="experts")
    assert [p.size for p in parts] == [3 * CHUNK, CHUNK + 5, CHUNK]
    assert [b.ptr - a.ptr for a, b in zip(parts, parts[1:])] == [3 * CHUNK, 2 * CHUNK], "from chunk boundaries"
    assert [p.name for p in parts] == ["experts[0]", "experts[1]", "experts[2]"]
    data = [pattern(i, p.size) for i, p in enumerate(parts)]
    for p, d in zip(parts, data):
        p.write(d)
    for p in parts:  # each moves alone, through an HBM of four chunks
        with pool.acquired([p]):
            pass
    assert [p.read() for p in parts] == data
    parts[1].free()
    assert parts[0].read() == data[0] and parts[2].read() == data[2], "freeing one part leaves the others"
    for bad, says in (([], "alloc_parts"), ([CHUNK, 0], "alloc_parts"), (["lots"], "sizes"), ([-1], "sizes")):
        with pytest.raises(tiermem.InvalidArgumentError, match=says):
            pool.alloc_parts(bad)
    with pytest.raises(tiermem.OutOfMemoryError, match="alloc_parts"):
        pool.alloc_parts([1 << 40, CHUNK])


def test_buffers_of_another_pool_are_refused(pool):
    other = tiermem.Pool(backend="sim", hbm_limit=2 * CHUNK, host_limit="8MiB")
    foreign = other.alloc(CHUNK)
    with pytest.raises(tiermem.InvalidArgumentError, match="another Pool"):
        pool.acquire([foreign])


def test_async_page_out_and_in_with_tickets(pool):
    buf = pool.alloc(2 * CHUNK)
    data = pattern(9, 2 * CHUNK)
    buf.write(data)
    pool.finish(pool.page_out_start(buf))
    assert pool.stats()["buffers"][0]["in_host"] == 2
    pool.finish(pool.page_in_start(buf))
    assert pool.stats()["buffers"][0]["in_hbm"] == 2
    with pytest.raises(tiermem.InvalidArgumentError, match="ticket"):
        pool.finish(12345)
    assert buf.read() == data


def test_cuda_array_interface_describes_the_buffer(pool):
    buf = pool.alloc(4096)
    cai = buf.__cuda_array_interface__
    assert cai["shape"] == (4096,) and cai["typestr"] == "|u1" and cai["version"] == 3
    assert cai["data"] == (buf.ptr, False)
    assert len(buf) == 4096 and buf.size == 4096


def test_file_tier_from_python(tmp_path):
    pool = tiermem.Pool(backend="sim", hbm_limit=2 * CHUNK, host_limit=2 * CHUNK, file=str(tmp_path / "tier"), file_limit="32MiB")
    bufs = [pool.alloc(2 * CHUNK) for _ in range(3)]
    for i, b in enumerate(bufs):
        b.write(pattern(i, 2 * CHUNK))
    pool.page_out_to_file(bufs[0])
    assert pool.stats()["transfers"]["file_writes"] >= 2
    for i, b in enumerate(bufs):
        assert b.read() == pattern(i, 2 * CHUNK)
    # Asynchronously: the write runs in the background until finish.
    pool.finish(pool.page_out_to_file_start(bufs[1]))
    assert pool.stats()["buffers"][1]["in_file"] == 2
    assert bufs[1].read() == pattern(1, 2 * CHUNK)


@pytest.mark.skipif(os.environ.get("TIERMEM_TEST_BACKEND") != "cuda", reason="needs a GPU (TIERMEM_TEST_BACKEND=cuda)")
def test_torch_wraps_a_buffer_without_a_copy():
    torch = pytest.importorskip("torch")
    pool = tiermem.Pool(backend="cuda", hbm_limit="64MiB")
    buf = pool.alloc(1 << 20)
    stream = torch.cuda.current_stream()
    with pool.acquired([buf], stream=stream.cuda_stream, write=True):
        t = torch.as_tensor(buf, device="cuda")
        t.fill_(7)
        torch.cuda.synchronize()
    assert buf.read(4) == bytes([7, 7, 7, 7])


def test_dlpack_exports_the_bytes_without_a_copy(pool):
    np = pytest.importorskip("numpy")
    buf = pool.alloc(8192)
    buf.write(b"dlpack!!", offset=4096)
    assert buf.__dlpack_device__() == (1, 0), "the simulated device's memory is host memory (kDLCPU)"
    with pool.acquired([buf], write=True):
        arr = np.from_dlpack(buf)
        assert arr.dtype == np.uint8 and arr.shape == (8192,)
        assert bytes(arr[4096:4104]) == b"dlpack!!"
        buf.write(bytes([1, 2, 3]))
        assert list(arr[0:3]) == [1, 2, 3], "the array is the buffer's memory, not a copy"


def test_a_dlpack_tensor_keeps_its_buffer_alive(pool):
    np = pytest.importorskip("numpy")
    buf = pool.alloc(4096)
    buf.write(b"alive")
    pool.acquire([buf])
    arr = np.from_dlpack(buf)
    del buf
    assert bytes(arr[:5]) == b"alive"
    assert len(pool.stats()["buffers"]) == 1, "the buffer lives while the array does"
    unused = pool.alloc(4096).__dlpack__()  # a capsule nobody consumes is freed with it
    del unused


def test_the_allocator_c_functions_never_crash_and_explain_failures(pool):
    """The functions PyTorch's CUDAPluggableAllocator calls, through ctypes on the simulated device."""
    import ctypes

    from tiermem import _tiermem

    lib = ctypes.CDLL(_tiermem.__file__)
    malloc, free = lib.tiermem_torch_malloc, lib.tiermem_torch_free
    malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    free.restype, free.argtypes = None, [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]

    _tiermem.set_allocator_pool(pool)
    ptr = malloc(3 * CHUNK, 0, None)
    assert ptr, _tiermem.allocator_error()
    assert _tiermem.allocator_live() == 1
    [buf] = [b for b in pool.stats()["buffers"] if b["name"] == "torch"]
    assert buf["acquired"] == 3, "an allocation stays resident while it lives"

    assert not malloc(-1, 0, None)
    assert "size -1 is negative" in _tiermem.allocator_error()
    assert not malloc(1 << 40, 0, None)
    assert "out of memory" in _tiermem.allocator_error()
    assert not malloc(CHUNK, 3, None)
    assert "device 3" in _tiermem.allocator_error()
    free(ptr + 1, 0, 0, None)
    assert "was not allocated by tiermem" in _tiermem.allocator_error()
    assert _tiermem.allocator_live() == 1, "a bad free changes nothing"

    free(ptr, 3 * CHUNK, 0, None)
    assert _tiermem.allocator_error() is None
    assert _tiermem.allocator_live() == 0
    assert pool.stats()["buffers"] == []


def test_release_idle_hbm_gives_hbm_back_and_no_byte_is_lost(pool):
    buffers = [pool.alloc(3 * CHUNK, name=f"b{i}") for i in range(2)]
    data = [pattern(i + 20, 3 * CHUNK) for i in range(2)]
    for buf, d in zip(buffers, data):
        buf.write(d)
    pool.page_out()
    assert pool.release_idle_hbm() == pool.hbm_cap, "every chunk created was idle after the page-out"
    assert pool.release_idle_hbm() == 0
    for buf, d in zip(buffers, data):
        pool.page_in(buf)
        assert buf.read() == d


def test_a_smaller_budget_is_met_and_a_larger_one_used_no_byte_lost(pool):
    buf = pool.alloc(4 * CHUNK)
    data = pattern(40, 4 * CHUNK)
    buf.write(data)
    pool.page_in(buf)
    pool.finish(pool.set_hbm_budget(CHUNK))
    assert pool.hbm_cap == CHUNK
    assert pool.stats()["hbm"]["used_bytes"] <= CHUNK
    with pytest.raises(tiermem.WouldNeverFitError):
        pool.acquire([buf])
    assert b"".join(buf.read(CHUNK, i * CHUNK) for i in range(4)) == data  # a chunk at a time
    pool.finish(pool.set_hbm_budget(4 * CHUNK))
    pool.page_in(buf)
    assert pool.stats()["hbm"]["used_bytes"] == 4 * CHUNK
    assert buf.read() == data
    with pytest.raises(tiermem.TiermemError, match="set_hbm_budget"):
        pool.set_hbm_budget("1000TiB")


def test_discarded_bytes_are_not_paged_back_and_kept_ones_are(pool):
    kept, scratch = pool.alloc(2 * CHUNK), pool.alloc(3 * CHUNK)
    kept.write(pattern(1, 2 * CHUNK))
    scratch.write(pattern(2, 3 * CHUNK))
    pool.page_out()
    page_ins = pool.stats()["transfers"]["page_ins"]
    assert pool.discard([(scratch, CHUNK, 2 * CHUNK)]) == 2, "chunks 1 and 2: the region reaches the end"
    assert scratch.read(CHUNK) == pattern(2, 3 * CHUNK)[:CHUNK], "chunk 0 keeps its bytes"
    assert scratch.read(2 * CHUNK, CHUNK) == bytes(2 * CHUNK), "discarded chunks come back as zeros"
    assert pool.stats()["transfers"]["page_ins"] == page_ins + 1, "only chunk 0 was paged in"
    assert kept.read() == pattern(1, 2 * CHUNK)
    assert pool.stats()["transfers"]["discarded"] == 2
    with pool.acquired([scratch]):
        with pytest.raises(tiermem.BufferStateError, match="discard"):
            pool.discard([scratch])
    with pytest.raises(tiermem.InvalidArgumentError, match="discard"):
        pool.discard([(scratch, 0, 4 * CHUNK)])
    assert pool.step_also_uses([kept]) is False, "no pass is being recorded"


def test_a_closed_pool_refuses_every_call_with_its_name(pool):
    buf = pool.alloc(CHUNK)
    assert not pool.closed
    pool.close()
    pool.close()
    assert pool.closed
    for call, name in [
        (lambda: pool.alloc(CHUNK), "alloc"),
        (lambda: pool.acquire(buf), "acquire"),
        (lambda: pool.page_in_start(buf), "page_in_start"),
        (lambda: pool.release_idle_hbm(), "release_idle_hbm"),
    ]:
        with pytest.raises(tiermem.BufferStateError, match=f"{name}: the Pool is closed"):
            call()


def test_write_takes_any_contiguous_byte_buffer_in_place(pool):
    buf = pool.alloc(CHUNK)
    data = pattern(30, 4096)
    buf.write(bytearray(data))
    buf.write(memoryview(data)[1024:2048], 1024)
    np = pytest.importorskip("numpy")
    buf.write(np.frombuffer(data, dtype=np.uint8)[2048:], 2048)
    assert buf.read(4096) == data
    with pytest.raises(tiermem.InvalidArgumentError, match="C-contiguous"):
        buf.write(memoryview(data)[::2])


def test_start_calls_run_on_several_threads_at_once(tmp_path):
    """page_in_start, page_out_start and page_out_to_file_start release the GIL like the other
    calls; from four threads at once, over every tier, no byte is lost."""
    import threading

    pool = tiermem.Pool(backend="sim", hbm_limit=4 * CHUNK, host_limit=4 * CHUNK,
                        file=str(tmp_path / "tier"), file_limit="64MiB")
    buffers = [pool.alloc(CHUNK, name=f"t{i}") for i in range(4)]
    data = [os.urandom(CHUNK) for _ in buffers]
    for buf, d in zip(buffers, data):
        buf.write(d)
    start = threading.Barrier(len(buffers))
    failures = []

    def cycle(buf):
        try:
            start.wait()
            for _ in range(10):
                pool.finish(pool.page_in_start(buf))
                pool.finish(pool.page_out_start(buf))
                pool.finish(pool.page_out_to_file_start(buf))
        except Exception as e:  # reported below, with the thread's buffer
            failures.append((buf, e))

    threads = [threading.Thread(target=cycle, args=(buf,)) for buf in buffers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a *_start call never returned"
    assert failures == []
    for buf, d in zip(buffers, data):
        assert buf.read() == d
    assert pool.stats()["transfers"]["file_writes"] >= len(buffers)


def test_the_first_pass_is_recorded_and_later_passes_are_paged_ahead(pool):
    """pass_begins / step_enters: the engine records the steps of the first pass, makes them
    the schedule when the next begins, and from then on finds each step and pages ahead."""
    layers = [pool.alloc(CHUNK, name=f"l{i}", read_only=True) for i in range(8)]
    data = [pattern(40 + i, CHUNK) for i in range(8)]
    for buf, d in zip(layers, data):
        buf.write(d)
    pool.page_out()
    located = []
    for _ in range(3):
        pool.pass_begins()
        located.append([pool.step_enters(100 + i, [buf, buf], CHUNK) for i, buf in enumerate(layers)])
        for buf in layers:
            with pool.acquired(buf):
                pass
    assert located == [[None] * 8, list(range(8)), list(range(8))]
    assert pool.recorded_steps == [100 + i for i in range(8)]
    assert pool.stats()["transfers"]["prefetched"] > 0, "nothing was paged ahead"
    assert pool.step_enters(7, [], 0) is None, "a step the schedule lacks is not found"
    pool.clear_schedule()
    assert pool.recorded_steps == []
    for buf, d in zip(layers, data):
        assert buf.read() == d


def test_stats_keep_the_keys_front_ends_read(pool):
    kept = pool.alloc(CHUNK, name="k")
    kept.write(b"k")
    stats = pool.stats()
    assert set(stats) == {"policy", "chunk_size", "hbm", "peer", "host", "file", "host_pinned_bytes", "transfers",
                          "allocated_chunks", "acquired_in_hbm", "buffers"}
    assert stats["policy"] == "lru" and stats["file"] is None and stats["peer"] is None
    assert stats["allocated_chunks"] == 1 and stats["acquired_in_hbm"] == 0
    assert set(stats["hbm"]) == {"capacity_bytes", "used_bytes", "chunks"}
    assert set(stats["transfers"]) == {
        "page_ins", "page_outs", "zero_fills", "clean_drops", "discarded", "evictions", "handed_over", "prefetched", "file_writes",
        "file_reads", "maps", "in_place_maps", "in_place_reads", "by_neighbours", "cleaned", "bytes_in", "bytes_out", "stall_ms", "map_ms", "unmap_ms", "evict_wait_ms",
        "acquires", "largest_acquire"}
    [buf] = stats["buffers"]
    assert set(buf) == {"id", "name", "size", "priority", "read_only", "chunks", "in_hbm", "in_peer", "in_place",
                        "in_host", "in_file", "empty", "moving", "acquired"}
    assert isinstance(buf["id"], int) and buf["name"] == "k" and buf["size"] == CHUNK
    assert isinstance(stats["transfers"]["stall_ms"], float)


def borrowing_pool(monkeypatch, **settings):
    """A Pool on GPU 0 of three simulated GPUs, borrowing eight chunks from its neighbours in
    all (GPU 1 lends them alone), with an HBM cap of two chunks; ``settings`` are more TIERMEM_*."""
    settings = {"SIM_GPUS": "3", "PEERS": "auto", "PEER_RESERVE": "0", "PEER_LIMIT": str(8 * CHUNK), **settings}
    for name, value in settings.items():
        monkeypatch.setenv(f"TIERMEM_{name}", value)
    return tiermem.Pool(backend="sim", hbm_limit=2 * CHUNK, host_limit="64MiB")


def test_a_buffer_read_in_place_on_a_simulated_node_keeps_its_bytes(monkeypatch):
    # Reads of an in_place buffer may be served where its chunks lie in a neighbour's HBM.
    pool = borrowing_pool(monkeypatch, PEER_IN_PLACE="on")
    buf = pool.alloc(8 * CHUNK, name="weights", in_place=True)
    data = pattern(5, 8 * CHUNK)
    buf.write(data)
    with pool.acquired([buf]):
        pass
    [stats] = pool.stats()["buffers"]
    assert stats["in_peer"] > 0 and stats["in_place"] > 0, stats
    assert pool.stats()["transfers"]["in_place_reads"] > 0
    assert buf.read() == data


def test_neighbours_lend_through_the_pool_and_take_their_memory_back(monkeypatch):
    pool = borrowing_pool(monkeypatch, PEER_CLEAN="off")
    assert [lender["gpu"] for lender in pool.peer_lenders()] == [1]
    assert any(note.startswith("GPU 2:") and "TIERMEM_PEER_LIMIT" in note for note in pool.peer_notes), pool.peer_notes
    buf = pool.alloc(8 * CHUNK, name="spilled")
    data = pattern(11, 8 * CHUNK)
    buf.write(data)
    [lender] = pool.peer_lenders()
    assert lender["borrowed"] == lender["lent"] == 8 * CHUNK, lender  # one slab made there
    assert pool.stats()["peer"]["chunks"] == 6
    assert pool.clean_borrowed(100) == 6
    assert pool.stats()["transfers"]["cleaned"] == 6
    assert pool.set_peer_lending(1, "0") == 8 * CHUNK
    assert pool.peer_lenders() == [{"gpu": 1, "lent": 0, "borrowed": 0, "busy": False}]
    assert buf.read() == data
    with pytest.raises(tiermem.InvalidArgumentError, match="set_peer_lending: GPU 0 does not lend"):
        pool.set_peer_lending(0, CHUNK)

def test_two_programs_each_get_a_schedule_and_forgetting_ones_steps_keeps_the_others(pool):
    """Two programs (two models in one pool) name their steps with keys of their own and run
    passes in turns: each pass is located in its program's schedule; forget_steps drops one
    program's schedule (its model removed) and keeps the other's."""
    layers = [pool.alloc(CHUNK, name=f"l{i}", read_only=True) for i in range(8)]
    data = [pattern(60 + i, CHUNK) for i in range(8)]
    for buf, d in zip(layers, data):
        buf.write(d)
    programs = {100: layers[:4], 200: layers[4:]}

    def run(base):
        pool.pass_begins()
        located = [pool.step_enters(base + i, [buf], CHUNK) for i, buf in enumerate(programs[base])]
        for buf in programs[base]:
            with pool.acquired(buf):
                pass
        return located

    assert run(100) == [None] * 4 and run(200) == [None] * 4, "each first pass is recorded"
    for _ in range(2):
        assert run(100) == list(range(4)) and run(200) == list(range(4))
    assert sorted(pool.recorded_steps) == [100, 101, 102, 103, 200, 201, 202, 203]
    pool.forget_steps([100, 101, 102, 103])
    assert pool.recorded_steps == [200, 201, 202, 203]
    assert run(200) == list(range(4)), "the other program keeps its schedule"
    assert run(100) == [None] * 4, "the forgotten one is recorded again"
    assert run(100) == list(range(4))
    for buf, d in zip(layers, data):
        assert buf.read() == d
