"""Does mapping VMM chunks wait for copies in flight, in which direction, and can a copy be
issued so that it does not? `bench engine` found mapping (cuMemMap + cuMemSetAccess) 12x slower
during a 1 GiB copy in one direction, the direction differing between processes. This probe
times, per chunk, mapping 64 chunks (16 per cuMemSetAccess) and creating them, while a 1 GiB
copy runs: up or down, on a high- or low-priority stream, whole or as 2 MiB pieces, after the
process first copied up or first copied down (ORDER). Prints one JSON object. A probe, not a
benchmark.

Usage: python map_stall.py [h2d-first|d2h-first]
"""
import ctypes as C
import json
import sys
import time

from vmm import Access, Location, Prop, cuda, ok, start

dev, ctx = start()
SIZE, CHUNKS = 1 << 30, 64
prop = Prop(type=1, requestedHandleTypes=0, location=Location(1, dev.value))
gran = C.c_size_t()
ok(cuda.cuMemGetAllocationGranularity(C.byref(gran), C.byref(prop), 0), "granularity")
g = gran.value
va = C.c_uint64()
ok(cuda.cuMemAddressReserve(C.byref(va), C.c_size_t(CHUNKS * g), C.c_size_t(0), C.c_uint64(0), C.c_uint64(0)), "reserve")
access = Access(Location(1, dev.value), 3)


def create():
    h = C.c_uint64()
    ok(cuda.cuMemCreate(C.byref(h), C.c_size_t(g), C.byref(prop), C.c_uint64(0)), "cuMemCreate")
    return h.value


chunks = [create() for _ in range(CHUNKS)]
host, plain = C.c_void_p(), C.c_uint64()
ok(cuda.cuMemHostAlloc(C.byref(host), C.c_size_t(SIZE), 0), "cuMemHostAlloc")
ok(cuda.cuMemAlloc_v2(C.byref(plain), C.c_size_t(SIZE)), "cuMemAlloc")
least, greatest = C.c_int(), C.c_int()
ok(cuda.cuCtxGetStreamPriorityRange(C.byref(least), C.byref(greatest)), "priority range")
streams = {}
for name, prio in (("high", greatest.value), ("low", least.value)):
    s = C.c_void_p()
    ok(cuda.cuStreamCreateWithPriority(C.byref(s), 1, prio), "stream")
    streams[name] = s


def copy(up, stream, piece):
    for off in range(0, SIZE, piece):
        n = C.c_size_t(min(piece, SIZE - off))
        if up:
            ok(cuda.cuMemcpyHtoDAsync_v2(C.c_uint64(plain.value + off), C.c_void_p(host.value + off), n, stream), "h2d")
        else:
            ok(cuda.cuMemcpyDtoHAsync_v2(C.c_void_p(host.value + off), C.c_uint64(plain.value + off), n, stream), "d2h")


def sync():
    for s in streams.values():
        ok(cuda.cuStreamSynchronize(s), "sync")


def map_us(load):
    """Microseconds per chunk to map and open all 64 chunks while `load` runs."""
    if load:
        copy(*load)
    t = time.perf_counter()
    for first in range(0, CHUNKS, 16):
        for i in range(first, first + 16):
            ok(cuda.cuMemMap(C.c_uint64(va.value + i * g), C.c_size_t(g), C.c_size_t(0), C.c_uint64(chunks[i]), C.c_uint64(0)), "map")
        ok(cuda.cuMemSetAccess(C.c_uint64(va.value + first * g), C.c_size_t(16 * g), C.byref(access), C.c_size_t(1)), "access")
    us = (time.perf_counter() - t) * 1e6 / CHUNKS
    sync()
    ok(cuda.cuMemUnmap(C.c_uint64(va.value), C.c_size_t(CHUNKS * g)), "unmap")
    return round(us, 1)


def create_us(load):
    """Microseconds per chunk to create (and release) 16 chunks while `load` runs."""
    if load:
        copy(*load)
    t = time.perf_counter()
    made = [create() for _ in range(16)]
    us = (time.perf_counter() - t) * 1e6 / 16
    sync()
    for h in made:
        ok(cuda.cuMemRelease(C.c_uint64(h)), "release")
    return round(us, 1)


order = sys.argv[1] if len(sys.argv) > 1 else "h2d-first"
copy(order == "h2d-first", streams["high"], SIZE)
sync()
copy(order != "h2d-first", streams["high"], SIZE)
sync()
map_us(None)
hi, lo = streams["high"], streams["low"]
out = {"order": order, "granularity": g, "map_us_per_chunk": {
    "idle": map_us(None),
    "during_h2d": map_us((True, hi, SIZE)),
    "during_d2h": map_us((False, hi, SIZE)),
    "during_h2d_low_priority": map_us((True, lo, SIZE)),
    "during_d2h_low_priority": map_us((False, lo, SIZE)),
    "during_h2d_2MiB_pieces": map_us((True, hi, g)),
    "during_d2h_2MiB_pieces": map_us((False, hi, g)),
}, "create_us_per_chunk": {
    "idle": create_us(None),
    "during_h2d": create_us((True, hi, SIZE)),
    "during_d2h": create_us((False, hi, SIZE)),
}}
print(json.dumps(out))
