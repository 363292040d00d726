"""How fast pinned host memory can be had on this machine: cuMemHostAlloc against anonymous
memory (4 KiB pages, or transparent huge pages) touched and then registered with
cuMemHostRegister. 1 GiB in 64 MiB slabs, three rounds each, medians; prints JSON.
A probe for the host tier's first-touch cost (BENCHMARKS.md), not a benchmark of tiermem."""
import ctypes, json, mmap, statistics, sys, time

from vmm import cuda, ok, start

_, ctx = start()
SLAB, TOTAL = 64 << 20, 1 << 30

def host_alloc():
    ptrs = []
    t = time.perf_counter()
    for _ in range(TOTAL // SLAB):
        p = ctypes.c_void_p()
        ok(cuda.cuMemHostAlloc(ctypes.byref(p), ctypes.c_size_t(SLAB), 1), "cuMemHostAlloc")
        ptrs.append(p)
    took = time.perf_counter() - t
    for p in ptrs:
        ok(cuda.cuMemFreeHost(p), "cuMemFreeHost")
    return took

def one_slab(huge, populate, touch=True):
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (getattr(mmap, "MAP_POPULATE", 0x8000) if populate else 0)
    m = mmap.mmap(-1, SLAB, flags=flags)
    if huge:
        m.madvise(mmap.MADV_HUGEPAGE)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    if touch and not populate:
        ctypes.memset(addr, 0, SLAB)
    ok(cuda.cuCtxSetCurrent(ctx), "set current")
    ok(cuda.cuMemHostRegister_v2(ctypes.c_void_p(addr), ctypes.c_size_t(SLAB), 1), "cuMemHostRegister")
    return (m, addr)

def registered(huge, populate, touch=True, threads=1):
    t = time.perf_counter()
    if threads == 1:
        maps = [one_slab(huge, populate, touch) for _ in range(TOTAL // SLAB)]
    else:
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(threads) as pool:
            maps = list(pool.map(lambda _: one_slab(huge, populate, touch), range(TOTAL // SLAB)))
    took = time.perf_counter() - t
    for m, addr in maps:
        ok(cuda.cuMemHostUnregister(ctypes.c_void_p(addr)), "cuMemHostUnregister")
    return took

def thp_state():
    try:
        return open("/sys/kernel/mm/transparent_hugepage/enabled").read().strip()
    except OSError as e:
        return str(e)

out = {"thp": thp_state(), "slab_bytes": SLAB, "total_bytes": TOTAL}
for name, f in [("cuMemHostAlloc", host_alloc),
                ("register_4k_touched", lambda: registered(False, False)),
                ("register_thp_touched", lambda: registered(True, False)),
                ("register_populate", lambda: registered(False, True)),
                ("register_thp_untouched", lambda: registered(True, False, touch=False)),
                ("register_thp_touched_4_threads", lambda: registered(True, False, threads=4)),
                ("register_thp_untouched_4_threads", lambda: registered(True, False, touch=False, threads=4)),
                ("register_thp_touched_8_threads", lambda: registered(True, False, threads=8))]:
    times = [f() for _ in range(3)]
    out[name + "_GBps"] = TOTAL / 1e9 / statistics.median(times)
print(json.dumps(out, indent=1))
