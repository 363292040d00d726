"""Can the per-chunk VMM calls of a move (unmap, map, cuMemSetAccess) go faster? migrate_cost.py
found them linear in chunks (~20 µs unmap, ~2 µs map, 22-50 µs access per 2 MiB chunk, host
chunks dearer) whatever the calls' sizes. This probe times the remap of N chunks (unmap + map +
access at the same addresses, swapping device for host chunks and back) from 1, 2, 4 and 8
threads at once (ctypes drops the GIL in driver calls), and with physical chunks of 2, 8 and 32
MiB. Prints one JSON object. A probe, not a benchmark.

Usage: python vmm_parallel.py [N]
"""
import ctypes as C
import json
import sys
import threading
import time

from vmm import Access, Location, Prop, cuda, ok, start

N = int(sys.argv[1]) if len(sys.argv) > 1 else 512
dev, ctx = start()
numa = C.c_int()
ok(cuda.cuDeviceGetAttribute(C.byref(numa), 134, dev), "HOST_NUMA_ID")
dev_prop = Prop(type=1, requestedHandleTypes=0, location=Location(1, dev.value))
host_prop = Prop(type=1, requestedHandleTypes=0, location=Location(3, max(numa.value, 0)))
access = Access(Location(1, dev.value), 3)
G = 2 << 20
out = {"chunks": N}


def create(prop, size):
    h = C.c_uint64()
    ok(cuda.cuMemCreate(C.byref(h), C.c_size_t(size), C.byref(prop), C.c_uint64(0)), "cuMemCreate")
    return h.value


def reserve(size):
    va = C.c_uint64()
    ok(cuda.cuMemAddressReserve(C.byref(va), C.c_size_t(size), C.c_size_t(0), C.c_uint64(0), C.c_uint64(0)), "reserve")
    return va.value


def map_at(va, h, size):
    ok(cuda.cuMemMap(C.c_uint64(va), C.c_size_t(size), C.c_size_t(0), C.c_uint64(h), C.c_uint64(0)), "map")
    ok(cuda.cuMemSetAccess(C.c_uint64(va), C.c_size_t(size), C.byref(access), C.c_size_t(1)), "access")


def unmap(va, size):
    ok(cuda.cuMemUnmap(C.c_uint64(va), C.c_size_t(size)), "unmap")


def remap_us(threads, unit):
    """µs per 2 MiB to swap every unit of a range from device to host handles and back."""
    count = N * G // unit
    base = reserve(count * unit)
    devs = [create(dev_prop, unit) for _ in range(count)]
    hosts = [create(host_prop, unit) for _ in range(count)]
    for i, h in enumerate(devs):
        map_at(base + i * unit, h, unit)

    def work(first, to):
        ok(cuda.cuCtxSetCurrent(ctx), "set current")
        for i in range(first, count, threads):
            unmap(base + i * unit, unit)
            map_at(base + i * unit, to[i], unit)

    result = {}
    for name, to in (("to_host", hosts), ("to_device", devs)):
        ts = [threading.Thread(target=work, args=(k, to)) for k in range(threads)]
        t = time.perf_counter()
        for th in ts:
            th.start()
        for th in ts:
            th.join()
        result[name] = round((time.perf_counter() - t) * 1e6 / (N * G // (2 << 20)), 2)
    unmap(base, count * unit)
    for h in devs + hosts:
        ok(cuda.cuMemRelease(C.c_uint64(h)), "release")
    ok(cuda.cuMemAddressFree(C.c_uint64(base), C.c_size_t(count * unit)), "free")
    return result


out["remap_us_per_2MiB_by_threads"] = {t: remap_us(t, G) for t in (1, 2, 4, 8)}
out["remap_us_per_2MiB_by_unit_MiB"] = {u >> 20: remap_us(1, u) for u in (G, 4 * G, 16 * G)}
out["remap_us_per_2MiB_32MiB_units_4_threads"] = remap_us(4, 16 * G)
print(json.dumps(out))
