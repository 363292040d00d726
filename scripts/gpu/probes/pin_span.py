"""Whether one copy may span two host ranges registered separately (cuMemHostRegister) that lie
next to each other in one mapping: 256 MiB mapped, registered as two pieces of 128 MiB, then a
copy to the GPU and back across the boundary (sync and async). Prints JSON."""
import ctypes, json, mmap

from vmm import cuda, ok, start

start()
HALF, SPAN = 128 << 20, 16 << 20
m = mmap.mmap(-1, 2 * HALF, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
base = ctypes.addressof(ctypes.c_char.from_buffer(m))
ctypes.memset(base, 7, 2 * HALF)
for i in range(2):
    ok(cuda.cuMemHostRegister_v2(ctypes.c_void_p(base + i * HALF), ctypes.c_size_t(HALF), 1), "register")
d = ctypes.c_uint64()
ok(cuda.cuMemAlloc_v2(ctypes.byref(d), ctypes.c_size_t(SPAN)), "alloc")
src = base + HALF - SPAN // 2
out = {}
out["sync_htod_across"] = cuda.cuMemcpyHtoD_v2(d, ctypes.c_void_p(src), ctypes.c_size_t(SPAN))
out["async_htod_across"] = cuda.cuMemcpyHtoDAsync_v2(d, ctypes.c_void_p(src), ctypes.c_size_t(SPAN), None)
out["async_dtoh_across"] = cuda.cuMemcpyDtoHAsync_v2(ctypes.c_void_p(src), d, ctypes.c_size_t(SPAN), None)
out["sync"] = cuda.cuCtxSynchronize()
out["async_htod_within"] = cuda.cuMemcpyHtoDAsync_v2(d, ctypes.c_void_p(base), ctypes.c_size_t(SPAN), None)
out["sync2"] = cuda.cuCtxSynchronize()
print(json.dumps(out))
