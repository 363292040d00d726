"""What does opening (cuMemSetAccess) a host-located VMM chunk cost, and on what does it depend?
Transparent mode's pauses at 0.5x spend ~0.7 ms opening each 32 MiB chunk that goes down to the
host (BENCHMARKS.md, thirty-fourth session: 4.2 s of a run against 0.43 s with a neighbour's HBM),
as long as copying it. This probe times, per chunk and per configuration (location type, chunk
size, shareable handle, RDMA flag, access flags): the first map + open at a fresh address, the
unmap, and a remap + open at the same address (a move's steady state), and the same for HBM
chunks. Prints one JSON object. A probe, not a benchmark.

Usage: python open_cost.py [TOTAL_MIB]
"""
import ctypes as C
import json
import os
import sys
import time

from vmm import Access, AllocFlags, Location, Prop, cuda, ok, start

TOTAL = (int(sys.argv[1]) if len(sys.argv) > 1 else 1024) << 20
dev, ctx = start()
numa = C.c_int()
ok(cuda.cuDeviceGetAttribute(C.byref(numa), 134, dev), "HOST_NUMA_ID")
out = {"total_bytes": TOTAL, "host_numa_id": numa.value, "configs": []}


def now():
    return time.perf_counter()


def create(prop, size):
    h = C.c_uint64()
    r = cuda.cuMemCreate(C.byref(h), C.c_size_t(size), C.byref(prop), C.c_uint64(0))
    return h.value if r == 0 else -r


def reserve(size):
    va = C.c_uint64()
    ok(cuda.cuMemAddressReserve(C.byref(va), C.c_size_t(size), C.c_size_t(1 << 21), C.c_uint64(0), C.c_uint64(0)), "reserve")
    return va.value


def measure(name, loc, size, handles=0, rdma=0, flags=3):
    prop = Prop(type=1, requestedHandleTypes=handles, location=loc, flags=AllocFlags(0, rdma, 0))
    access = Access(Location(1, dev.value), flags)
    n = max(TOTAL // size, 1)
    row = {"name": name, "chunk_mib": size >> 20, "chunks": n}
    t = now()
    hs = [create(prop, size) for _ in range(n)]
    row["create_ms"] = round((now() - t) * 1e3 / n, 3)
    if any(h < 0 for h in hs):
        row["error"] = f"cuMemCreate failed: CUresult {-min(hs)}"
        out["configs"].append(row)
        print(json.dumps(row), flush=True)
        return
    va = reserve(n * size)
    shadow = reserve(n * size)

    def map_all(base):
        t = now()
        for i, h in enumerate(hs):
            ok(cuda.cuMemMap(C.c_uint64(base + i * size), C.c_size_t(size), C.c_size_t(0), C.c_uint64(h), C.c_uint64(0)), "map")
        m = now()
        for i in range(n):
            ok(cuda.cuMemSetAccess(C.c_uint64(base + i * size), C.c_size_t(size), C.byref(access), C.c_size_t(1)), "access")
        return (m - t) * 1e3 / n, (now() - m) * 1e3 / n

    def unmap_all(base):
        t = now()
        for i in range(n):
            ok(cuda.cuMemUnmap(C.c_uint64(base + i * size), C.c_size_t(size)), "unmap")
        return (now() - t) * 1e3 / n

    row["first_map_ms"], row["first_open_ms"] = (round(x, 3) for x in map_all(va))
    row["unmap_ms"] = round(unmap_all(va), 3)
    row["again_map_ms"], row["again_open_ms"] = (round(x, 3) for x in map_all(va))
    # A second mapping of each chunk elsewhere (a shadow) while the first stays.
    row["shadow_map_ms"], row["shadow_open_ms"] = (round(x, 3) for x in map_all(shadow))
    unmap_all(va)
    row["with_shadow_map_ms"], row["with_shadow_open_ms"] = (round(x, 3) for x in map_all(va))
    row["open_gb_s"] = round(size / (row["again_open_ms"] * 1e-3) / 1e9, 1) if row["again_open_ms"] else None
    unmap_all(va)
    unmap_all(shadow)
    for h in hs:
        ok(cuda.cuMemRelease(C.c_uint64(h)), "release")
    for base in (va, shadow):
        ok(cuda.cuMemAddressFree(C.c_uint64(base), C.c_size_t(n * size)), "free")
    out["configs"].append(row)
    print(json.dumps(row), flush=True)


MiB = 1 << 20
host_numa = Location(3, max(numa.value, 0))
measure("hbm", Location(1, dev.value), 32 * MiB)
for size in (2, 32, 128, 512):
    measure("host_numa", host_numa, size * MiB)
measure("host_numa_posix_fd", host_numa, 32 * MiB, handles=1)
measure("host_numa_rdma", host_numa, 32 * MiB, rdma=1)
measure("host_numa_read_only", host_numa, 32 * MiB, flags=1)
measure("host", Location(2, 0), 32 * MiB)
measure("host_numa_current", Location(4, 0), 32 * MiB)
for path in ("/sys/class/iommu", "/proc/cmdline", "/sys/kernel/mm/transparent_hugepage/enabled"):
    try:
        out[path] = os.listdir(path) if os.path.isdir(path) else open(path).read().strip()
    except OSError as why:
        out[path] = str(why)
print(json.dumps(out))
