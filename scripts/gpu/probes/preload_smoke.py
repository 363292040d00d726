"""An unmodified CUDA program for `tiermem run` on the real GPU (issue 16, stage 1): it loads
libcuda.so.1 with dlopen and takes its entry points by dlsym, as ctypes does, and checks what a
program would see: cuMemGetInfo_v2 reports the budget; allocations beyond it still succeed
(their chunks mapped in host memory); bytes written by copies and by the GPU itself (cuMemsetD8
runs on the device, so it reaches host-located chunks through the GPU's mapping) read back
intact; a double free gets the driver's error. Prints one JSON line; exits 1 on a failed check.

Usage: tiermem run --hbm-limit 128MiB --stats -- python3 preload_smoke.py [BYTES_PER_BUFFER]
"""
import ctypes as C
import json
import os
import sys

cuda = C.CDLL("libcuda.so.1")
MIB = 1 << 20
checks, failures = {}, []


def ok(r, what):
    if r != 0:
        raise SystemExit(f"{what} failed: CUresult {r}")


def check(name, cond, detail=""):
    checks[name] = bool(cond)
    if not cond:
        failures.append(f"{name}: {detail}")


ok(cuda.cuInit(0), "cuInit")
dev, ctx = C.c_int(), C.c_void_p()
ok(cuda.cuDeviceGet(C.byref(dev), 0), "cuDeviceGet")
ok(cuda.cuDevicePrimaryCtxRetain(C.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
ok(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

free, total = C.c_size_t(), C.c_size_t()
ok(cuda.cuMemGetInfo_v2(C.byref(free), C.byref(total)), "cuMemGetInfo_v2")
budget = int(os.environ.get("TIERMEM_HBM_LIMIT", "0"))
check("mem_get_info_reports_budget", budget == 0 or total.value == budget, f"total {total.value}, budget {budget}")

size = int(sys.argv[1]) if len(sys.argv) > 1 else 64 * MIB
buffers = []
for i in range(3):
    p = C.c_uint64()
    ok(cuda.cuMemAlloc_v2(C.byref(p), C.c_size_t(size)), f"cuMemAlloc_v2 #{i}")
    buffers.append(p.value)
ok(cuda.cuMemGetInfo_v2(C.byref(free), C.byref(total)), "cuMemGetInfo_v2")
free_after = free.value

host = (C.c_ubyte * size)()
back = (C.c_ubyte * size)()
for i, d in enumerate(buffers):
    # Half written by a copy, half by the GPU (cuMemsetD8 runs on the device).
    C.memset(host, 17 + i, size)
    ok(cuda.cuMemcpyHtoD_v2(C.c_uint64(d), host, C.c_size_t(size // 2)), "cuMemcpyHtoD_v2")
    ok(cuda.cuMemsetD8_v2(C.c_uint64(d + size // 2), C.c_ubyte(101 + i), C.c_size_t(size - size // 2)), "cuMemsetD8_v2")
ok(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
for i, d in enumerate(buffers):
    ok(cuda.cuMemcpyDtoH_v2(back, C.c_uint64(d), C.c_size_t(size)), "cuMemcpyDtoH_v2")
    data = bytes(back)
    good = data[: size // 2] == bytes([17 + i]) * (size // 2) and data[size // 2:] == bytes([101 + i]) * (size - size // 2)
    check(f"buffer_{i}_bytes_intact", good, "bytes differ")
# A device-to-device copy across buffers (the last one is beyond the budget).
ok(cuda.cuMemcpyDtoD_v2(C.c_uint64(buffers[2]), C.c_uint64(buffers[0]), C.c_size_t(size)), "cuMemcpyDtoD_v2")
ok(cuda.cuMemcpyDtoH_v2(back, C.c_uint64(buffers[2]), C.c_size_t(size)), "cuMemcpyDtoH_v2")
check("device_to_device_copy_intact", bytes(back)[:4] == bytes([17] * 4) and bytes(back)[-4:] == bytes([101] * 4))

# Small allocations (at most 1 MiB) that fit the budget are the driver's own, counted against it.
for d in buffers[1:]:
    ok(cuda.cuMemFree_v2(C.c_uint64(d)), "cuMemFree_v2")
buffers = buffers[:1]
ok(cuda.cuMemGetInfo_v2(C.byref(free), C.byref(total)), "cuMemGetInfo_v2")
room = free.value
small = []
for i in range(1000):
    p = C.c_uint64()
    ok(cuda.cuMemAlloc_v2(C.byref(p), C.c_size_t(4096)), "cuMemAlloc_v2 (4 KiB)")
    small.append(p.value)
ok(cuda.cuMemGetInfo_v2(C.byref(free), C.byref(total)), "cuMemGetInfo_v2")
check("small_allocations_counted", budget == 0 or room - free.value == 1000 * 4096, f"{room - free.value} B counted")
cell = (C.c_ubyte * 4096)()
for i in range(0, 1000, 99):
    C.memset(cell, i % 251, 4096)
    ok(cuda.cuMemcpyHtoD_v2(C.c_uint64(small[i]), cell, C.c_size_t(4096)), "cuMemcpyHtoD_v2 (small)")
for i in range(0, 1000, 99):
    ok(cuda.cuMemcpyDtoH_v2(cell, C.c_uint64(small[i]), C.c_size_t(4096)), "cuMemcpyDtoH_v2 (small)")
    check(f"small_{i}_intact", bytes(cell) == bytes([i % 251]) * 4096)
for d in small:
    ok(cuda.cuMemFree_v2(C.c_uint64(d)), "cuMemFree_v2 (small)")
ok(cuda.cuMemGetInfo_v2(C.byref(free), C.byref(total)), "cuMemGetInfo_v2")
check("small_frees_give_the_budget_back", free.value == room, f"{free.value} vs {room}")

for d in buffers:
    ok(cuda.cuMemFree_v2(C.c_uint64(d)), "cuMemFree_v2")
again = cuda.cuMemFree_v2(C.c_uint64(buffers[0]))
check("double_free_is_the_drivers_error", again != 0, f"CUresult {again}")
ok(cuda.cuMemGetInfo_v2(C.byref(free), C.byref(total)), "cuMemGetInfo_v2")
check("budget_whole_again", budget == 0 or free.value == total.value, f"free {free.value} of {total.value}")
print(json.dumps({"budget": budget, "total": total.value, "free_after_allocating": free_after, "bytes_per_buffer": size,
                  "double_free_result": again, "checks": checks, "ok": not failures}))
if failures:
    print("FAILED: " + "; ".join(failures), file=sys.stderr)
    sys.exit(1)
