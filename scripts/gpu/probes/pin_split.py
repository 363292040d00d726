"""Where pinning host memory the host tier's way spends its time, and whether it parallelizes:
faulting in huge pages with N threads alone, then registering (cuMemHostRegister) 1 GiB in one
call against the same 1 GiB registered as 8 pieces of 128 MiB from 8 threads at once.
Three rounds each, medians; prints JSON. A probe for the reclaim cost (BENCHMARKS.md)."""
import ctypes, json, mmap, statistics, time
from concurrent.futures import ThreadPoolExecutor

from vmm import cuda, ok, start

_, ctx = start()
TOTAL, HUGE = 1 << 30, 2 << 20


def fresh():
    m = mmap.mmap(-1, TOTAL + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    start = (base + HUGE - 1) // HUGE * HUGE
    m.madvise(mmap.MADV_HUGEPAGE, start - base, TOTAL)
    return m, start


def touch(start, threads):
    piece = TOTAL // threads
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda i: ctypes.memset(start + i * piece, 0, piece), range(threads)))


def register(start, pieces):
    piece = TOTAL // pieces

    def one(i):
        ok(cuda.cuCtxSetCurrent(ctx), "set current")
        ok(cuda.cuMemHostRegister_v2(ctypes.c_void_p(start + i * piece), ctypes.c_size_t(piece), 1), "register")

    with ThreadPoolExecutor(pieces) as pool:
        list(pool.map(one, range(pieces)))
    return piece


def unregister(start, pieces):
    piece = TOTAL // pieces
    for i in range(pieces):
        ok(cuda.cuMemHostUnregister(ctypes.c_void_p(start + i * piece)), "unregister")


def round_of(threads, pieces):
    m, start = fresh()
    t0 = time.perf_counter()
    touch(start, threads)
    t1 = time.perf_counter()
    register(start, pieces)
    t2 = time.perf_counter()
    unregister(start, pieces)
    m.close()
    return t1 - t0, t2 - t1


out = {"total_bytes": TOTAL}
for threads, pieces in [(8, 1), (16, 1), (8, 8), (16, 16), (8, 4)]:
    rounds = [round_of(threads, pieces) for _ in range(3)]
    t_touch = statistics.median(r[0] for r in rounds)
    t_reg = statistics.median(r[1] for r in rounds)
    out[f"touch_{threads}_threads_GBps"] = TOTAL / 1e9 / t_touch
    out[f"register_{pieces}_pieces_after_{threads}_GBps"] = TOTAL / 1e9 / t_reg
    out[f"both_{threads}_threads_{pieces}_pieces_GBps"] = TOTAL / 1e9 / (t_touch + t_reg)
print(json.dumps(out, indent=1))
