"""Do VMM remaps cost more while another process's kernels run on the GPU, and per call or per
mapping? On the H200 pair (followup41d), a transparent program's pauses took ~10 ms a chunk
(remapping and opening) while a second program ran kernels on its GPU, against ~0.5 ms alone.
This probe times a move's driver steps over 1 GiB of 32 MiB chunks, HBM-located and
host-located: per chunk (unmap, map, cuMemSetAccess each), and batched (one cuMemUnmap and one
cuMemSetAccess over each run of 8 neighbouring chunks, cuMemMap per chunk) — alone, then while a
second process keeps GPU 0 busy with elementwise kernels over 4 GiB (hammer.py), and again with
that process under `tiermem run --policy placement --hbm-limit 2GiB` (TIERMEM, its kernels
reading half their tensors from host memory in place). Prints one JSON line per row. A probe,
not a benchmark. Usage: python contended_remap.py [TIERMEM]"""
import ctypes as C
import json
import subprocess
import sys
import time
from pathlib import Path

from vmm import Access, AllocFlags, Location, Prop, cuda, ok, start

MiB, SIZE, N, RUN = 1 << 20, 32 << 20, 32, 8
dev, ctx = start()
numa = C.c_int()
ok(cuda.cuDeviceGetAttribute(C.byref(numa), 134, dev), "HOST_NUMA_ID")
access = Access(Location(1, dev.value), 3)


def create(loc):
    prop = Prop(type=1, requestedHandleTypes=0, location=loc, flags=AllocFlags(0, 0, 0))
    hs = []
    for _ in range(N):
        h = C.c_uint64()
        ok(cuda.cuMemCreate(C.byref(h), C.c_size_t(SIZE), C.byref(prop), C.c_uint64(0)), "create")
        hs.append(h.value)
    return hs


def reserve():
    va = C.c_uint64()
    ok(cuda.cuMemAddressReserve(C.byref(va), C.c_size_t(N * SIZE), C.c_size_t(2 * MiB), C.c_uint64(0), C.c_uint64(0)), "reserve")
    return va.value


def map_chunks(va, hs):
    for i, h in enumerate(hs):
        ok(cuda.cuMemMap(C.c_uint64(va + i * SIZE), C.c_size_t(SIZE), C.c_size_t(0), C.c_uint64(h), C.c_uint64(0)), "map")


def per_chunk(va, old, new):
    """Each chunk: unmap `old`, map `new`, open. ms per chunk: (unmap+map, open)."""
    t0 = time.perf_counter()
    for i in range(N):
        ok(cuda.cuMemUnmap(C.c_uint64(va + i * SIZE), C.c_size_t(SIZE)), "unmap")
        ok(cuda.cuMemMap(C.c_uint64(va + i * SIZE), C.c_size_t(SIZE), C.c_size_t(0), C.c_uint64(new[i]), C.c_uint64(0)), "map")
    t1 = time.perf_counter()
    for i in range(N):
        ok(cuda.cuMemSetAccess(C.c_uint64(va + i * SIZE), C.c_size_t(SIZE), C.byref(access), C.c_size_t(1)), "access")
    t2 = time.perf_counter()
    return (t1 - t0) * 1e3 / N, (t2 - t1) * 1e3 / N


def batched(va, old, new):
    """Runs of RUN chunks: one unmap and one open per run, a map per chunk."""
    t0 = time.perf_counter()
    for r in range(0, N, RUN):
        ok(cuda.cuMemUnmap(C.c_uint64(va + r * SIZE), C.c_size_t(RUN * SIZE)), "unmap run")
        for i in range(r, r + RUN):
            ok(cuda.cuMemMap(C.c_uint64(va + i * SIZE), C.c_size_t(SIZE), C.c_size_t(0), C.c_uint64(new[i]), C.c_uint64(0)), "map")
    t1 = time.perf_counter()
    for r in range(0, N, RUN):
        ok(cuda.cuMemSetAccess(C.c_uint64(va + r * SIZE), C.c_size_t(RUN * SIZE), C.byref(access), C.c_size_t(1)), "access run")
    t2 = time.perf_counter()
    return (t1 - t0) * 1e3 / N, (t2 - t1) * 1e3 / N


hbm = Location(1, dev.value)
host = Location(3, max(numa.value, 0))
a, b = create(hbm), create(host)
va = reserve()
map_chunks(va, a)
ok(cuda.cuMemSetAccess(C.c_uint64(va), C.c_size_t(N * SIZE), C.byref(access), C.c_size_t(1)), "access")


def rows(label):
    for name, how in (("per_chunk", per_chunk), ("batched", batched)):
        for _ in range(3):
            down = how(va, a, b)  # HBM -> host
            up = how(va, b, a)  # host -> HBM
            print(json.dumps({"load": label, "how": name, "down_remap_ms": round(down[0], 3), "down_open_ms": round(down[1], 3),
                              "up_remap_ms": round(up[0], 3), "up_open_ms": round(up[1], 3)}), flush=True)


rows("alone")
loads = [("another process's kernels", [])]
if len(sys.argv) > 1:
    loads.append(("another process's kernels reading host memory",
                  [sys.argv[1], "run", "--policy", "placement", "--hbm-limit", "2GiB", "--"]))
for label, prefix in loads:
    hammer = subprocess.Popen([*prefix, sys.executable, str(Path(__file__).parent / "hammer.py"), "60", "4"],
                              stdout=subprocess.PIPE, text=True)
    assert hammer.stdout.readline().strip() == "ready"
    time.sleep(1)
    rows(label)
    hammer.kill()
    hammer.wait()
