"""Where does a transparent-mode move's time go? Stage 3's pauses moved a 2 MiB chunk every
262 µs (8 GB/s) on the H200, though DESIGN.md's VMM costs add up to ~60 µs. This probe times
each step of migrate.rs's batch, for N chunks going down (HBM -> host-located VMM chunk) and up:
creating host-located and device chunks, mapping at a scratch range, cuMemSetAccess, the copies
(2 MiB pieces and one whole copy; HBM <-> host-located VMM, against cuMemHostAlloc memory),
unmapping, and the per-chunk unmap + map + access at the program's address. Prints one JSON
object. A probe, not a benchmark.

Usage: python migrate_cost.py [N]
"""
import ctypes as C
import json
import sys
import time

from vmm import Access, Location, Prop, cuda, ok, start

N = int(sys.argv[1]) if len(sys.argv) > 1 else 256
dev, ctx = start()
numa = C.c_int()
ok(cuda.cuDeviceGetAttribute(C.byref(numa), 134, dev), "HOST_NUMA_ID")  # CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID
dev_prop = Prop(type=1, requestedHandleTypes=0, location=Location(1, dev.value))
host_prop = Prop(type=1, requestedHandleTypes=0, location=Location(3, max(numa.value, 0)))  # HOST_NUMA
gran = C.c_size_t()
ok(cuda.cuMemGetAllocationGranularity(C.byref(gran), C.byref(dev_prop), 0), "granularity")
G = gran.value
access = Access(Location(1, dev.value), 3)
out = {"chunks": N, "chunk_bytes": G, "host_numa_id": numa.value}


def timed(name, fn, per=N):
    t = time.perf_counter()
    r = fn()
    out.setdefault("us_per_chunk", {})[name] = round((time.perf_counter() - t) * 1e6 / per, 2)
    return r


def create(prop):
    h = C.c_uint64()
    ok(cuda.cuMemCreate(C.byref(h), C.c_size_t(G), C.byref(prop), C.c_uint64(0)), "cuMemCreate")
    return h.value


def reserve():
    va = C.c_uint64()
    ok(cuda.cuMemAddressReserve(C.byref(va), C.c_size_t(N * G), C.c_size_t(0), C.c_uint64(0), C.c_uint64(0)), "reserve")
    return va.value


def map_at(va, h):
    ok(cuda.cuMemMap(C.c_uint64(va), C.c_size_t(G), C.c_size_t(0), C.c_uint64(h), C.c_uint64(0)), "map")


def set_access(va, size):
    ok(cuda.cuMemSetAccess(C.c_uint64(va), C.c_size_t(size), C.byref(access), C.c_size_t(1)), "access")


def unmap(va, size):
    ok(cuda.cuMemUnmap(C.c_uint64(va), C.c_size_t(size)), "unmap")


def sync():
    ok(cuda.cuCtxSynchronize(), "sync")


def gbps(name, fn, nbytes=N * G, reps=3):
    best = None
    for _ in range(reps):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        s = time.perf_counter() - t
        best = s if best is None else min(best, s)
    out.setdefault("copy_gb_s", {})[name] = round(nbytes / best / 1e9, 2)


def copy_pieces(dst, src):
    for i in range(N):
        ok(cuda.cuMemcpyDtoDAsync_v2(C.c_uint64(dst + i * G), C.c_uint64(src + i * G), C.c_size_t(G), None), "dtod")


def copy_whole(dst, src):
    ok(cuda.cuMemcpyDtoDAsync_v2(C.c_uint64(dst), C.c_uint64(src), C.c_size_t(N * G), None), "dtod")


dev_chunks = timed("create_device", lambda: [create(dev_prop) for _ in range(N)])
host_chunks = timed("create_host", lambda: [create(host_prop) for _ in range(N)])
program, scratch = reserve(), reserve()
for i, h in enumerate(dev_chunks):
    map_at(program + i * G, h)
set_access(program, N * G)
ok(cuda.cuMemsetD8_v2(C.c_uint64(program), C.c_ubyte(7), C.c_size_t(N * G)), "memset")
sync()

# Down, as migrate.rs does it: host chunks at the scratch range, access, copies, unmap scratch.
timed("map_scratch", lambda: [map_at(scratch + i * G, h) for i, h in enumerate(host_chunks)])
timed("set_access_scratch_one_call", lambda: set_access(scratch, N * G))
t = time.perf_counter()
copy_pieces(scratch, program)
sync()
out["us_per_chunk"]["copy_down_pieces_legacy_stream"] = round((time.perf_counter() - t) * 1e6 / N, 2)
gbps("hbm_to_host_vmm_2MiB_pieces", lambda: copy_pieces(scratch, program))
gbps("hbm_to_host_vmm_whole", lambda: copy_whole(scratch, program))
gbps("host_vmm_to_hbm_2MiB_pieces", lambda: copy_pieces(program, scratch))
gbps("host_vmm_to_hbm_whole", lambda: copy_whole(program, scratch))
# The same against cuMemHostAlloc memory (the engine's host tier).
pinned = C.c_void_p()
ok(cuda.cuMemHostAlloc(C.byref(pinned), C.c_size_t(N * G), 0), "cuMemHostAlloc")
gbps("hbm_to_pinned_whole", lambda: ok(cuda.cuMemcpyDtoHAsync_v2(pinned, C.c_uint64(program), C.c_size_t(N * G), None), "dtoh"))
gbps("pinned_to_hbm_whole", lambda: ok(cuda.cuMemcpyHtoDAsync_v2(C.c_uint64(program), pinned, C.c_size_t(N * G), None), "htod"))
timed("unmap_scratch_one_call", lambda: unmap(scratch, N * G))

# The swap at the program's address, per chunk, then access in one call.
timed("unmap_program_per_chunk", lambda: [unmap(program + i * G, G) for i in range(N)])
timed("map_program_per_chunk", lambda: [map_at(program + i * G, h) for i, h in enumerate(host_chunks)])
timed("set_access_program_one_call", lambda: set_access(program, N * G))
timed("set_access_program_per_chunk", lambda: [set_access(program + i * G, G) for i in range(N)])
# Whole-range unmap and remap (what a run-wise swap would cost).
timed("unmap_program_one_call", lambda: unmap(program, N * G))
timed("map_program_again", lambda: [map_at(program + i * G, h) for i, h in enumerate(dev_chunks)])
timed("set_access_after_remap", lambda: set_access(program, N * G))
# Does a D2H copy on another stream slow the VMM calls (the pause overlapping transfers)?
stream = C.c_void_p()
ok(cuda.cuStreamCreate(C.byref(stream), 1), "stream")
ok(cuda.cuMemcpyDtoHAsync_v2(pinned, C.c_uint64(program), C.c_size_t(N * G), stream), "dtoh")
timed("map_scratch_during_d2h", lambda: [map_at(scratch + i * G, h) for i, h in enumerate(host_chunks)])
timed("set_access_scratch_during_d2h", lambda: set_access(scratch, N * G))
timed("unmap_scratch_during_d2h", lambda: unmap(scratch, N * G))
sync()
timed("release_host", lambda: [ok(cuda.cuMemRelease(C.c_uint64(h)), "release") for h in host_chunks])
timed("release_device", lambda: [ok(cuda.cuMemRelease(C.c_uint64(h)), "release") for h in dev_chunks])
print(json.dumps(out))
