"""Whether pinned memory registered with cuMemHostRegister (anonymous, transparent huge pages,
as tiermem's host tier now makes it) copies as fast as cuMemHostAlloc's: 1 GiB synchronous
H2D and D2H copies from each, five rounds, medians; prints JSON. A probe, not a benchmark."""
import ctypes, json, mmap, statistics, time

from vmm import cuda, ok, start

start()
SIZE = 1 << 30
d = ctypes.c_uint64()
ok(cuda.cuMemAlloc_v2(ctypes.byref(d), ctypes.c_size_t(SIZE)), "cuMemAlloc")
a = ctypes.c_void_p()
ok(cuda.cuMemHostAlloc(ctypes.byref(a), ctypes.c_size_t(SIZE), 1), "cuMemHostAlloc")
m = mmap.mmap(-1, SIZE + (2 << 20))
base = ctypes.addressof(ctypes.c_char.from_buffer(m))
b = (base + (2 << 20) - 1) & ~((2 << 20) - 1)
ctypes.CDLL(None).madvise(ctypes.c_void_p(b), ctypes.c_size_t(SIZE), 14)
ctypes.memset(b, 1, SIZE)
ok(cuda.cuMemHostRegister_v2(ctypes.c_void_p(b), ctypes.c_size_t(SIZE), 1), "cuMemHostRegister")

def gbps(f):
    times = []
    for _ in range(6):
        t = time.perf_counter(); f(); times.append(time.perf_counter() - t)
    return SIZE / 1e9 / statistics.median(times[1:])

out = {}
for name, host in [("host_alloc", a.value), ("registered_thp", b)]:
    out[name + "_h2d_GBps"] = gbps(lambda: ok(cuda.cuMemcpyHtoD_v2(d, ctypes.c_void_p(host), ctypes.c_size_t(SIZE)), "h2d"))
    out[name + "_d2h_GBps"] = gbps(lambda: ok(cuda.cuMemcpyDtoH_v2(ctypes.c_void_p(host), d, ctypes.c_size_t(SIZE)), "d2h"))
print(json.dumps(out, indent=1))
