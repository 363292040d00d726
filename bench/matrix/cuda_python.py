"""CUDA Python (`cuda.bindings`), unmodified: the driver API called from Python — a PTX module
loaded and JIT-compiled by the driver, kernels launched with `cuLaunchKernel` over buffers from
`cuMemAlloc` (3 GiB in 12 buffers), host copies, `cuMemsetD32`, stream-ordered allocations and
`cuMemGetInfo`. The bindings fetch every entry point through `cuGetProcAddress`; with `--ptds`
they ask for the per-thread default stream's variants (CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM).
The digest: every result buffer's bytes."""
import hashlib
import os
import sys

if "--ptds" in sys.argv:
    os.environ["CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM"] = "1"
try:
    from cuda.bindings import driver as cu
except ImportError:
    try:
        from cuda import cuda as cu
    except ImportError:
        print('{"skipped": "cuda-python (cuda.bindings) is not installed"}')
        sys.exit(0)
import numpy as np

from common import report

PTX = rb"""
.version 7.0
.target sm_70
.address_size 64

// y[i] = a * x[i] + y[i] for i < n
.visible .entry axpy(.param .u64 y_ptr, .param .u64 x_ptr, .param .f32 a, .param .u64 n)
{
    .reg .pred p;
    .reg .b32 r<4>;
    .reg .b64 rd<9>;
    .reg .f32 f<5>;
    ld.param.u64 rd1, [y_ptr];
    ld.param.u64 rd2, [x_ptr];
    ld.param.f32 f1, [a];
    ld.param.u64 rd3, [n];
    mov.u32 r1, %ctaid.x;
    mov.u32 r2, %ntid.x;
    mov.u32 r3, %tid.x;
    mul.wide.u32 rd4, r1, r2;
    cvt.u64.u32 rd5, r3;
    add.u64 rd4, rd4, rd5;
    setp.ge.u64 p, rd4, rd3;
    @p bra DONE;
    cvta.to.global.u64 rd6, rd1;
    cvta.to.global.u64 rd7, rd2;
    shl.b64 rd8, rd4, 2;
    add.u64 rd6, rd6, rd8;
    add.u64 rd7, rd7, rd8;
    ld.global.f32 f2, [rd7];
    ld.global.f32 f3, [rd6];
    fma.rn.f32 f4, f1, f2, f3;
    st.global.f32 [rd6], f4;
DONE:
    ret;
}
"""


def check(result):
    """The value(s) of a binding's (error, values…) tuple, or exit naming the error."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(err)
        sys.exit(f"cuda_python: {name.decode() if name else err}")
    return values[0] if len(values) == 1 else values


check(cu.cuInit(0))
device = check(cu.cuDeviceGet(0))
context = check(cu.cuDevicePrimaryCtxRetain(device))
check(cu.cuCtxSetCurrent(context))
module = check(cu.cuModuleLoadData(PTX))
axpy = check(cu.cuModuleGetFunction(module, b"axpy"))
stream = check(cu.cuStreamCreate(0))

n = 64 << 20  # floats: 256 MiB a buffer
size = 4 * n
xs, ys = [], []
for i in range(8):
    xs.append(check(cu.cuMemAlloc(size)))
    host = ((np.arange(n, dtype=np.uint32) % 1009).astype(np.float32) * np.float32(0.001)) + np.float32(i)
    check(cu.cuMemcpyHtoD(xs[-1], host.ctypes.data, size))
for j in range(4):
    ys.append(check(cu.cuMemAlloc(size)))
    check(cu.cuMemsetD32(ys[-1], np.float32(j).view(np.uint32).item(), n))
free, total = check(cu.cuMemGetInfo())


def launch(y, x, a):
    values = [np.array([int(y)], np.uint64), np.array([int(x)], np.uint64), np.array([a], np.float32),
              np.array([n], np.uint64)]
    params = np.array([v.ctypes.data for v in values], np.uint64)
    check(cu.cuLaunchKernel(axpy, n // 256, 1, 1, 256, 1, 1, 0, stream, params.ctypes.data, 0))


for round_ in range(6):
    for i, x in enumerate(xs):
        launch(ys[(i + round_) % 4], x, 0.5 + 0.125 * round_)
    # A stream-ordered temporary each round, set, added in and freed on the stream.
    temp = check(cu.cuMemAllocAsync(size, stream))
    check(cu.cuMemsetD32Async(temp, np.float32(0.25).view(np.uint32).item(), n, stream))
    launch(ys[round_ % 4], temp, 1.0)
    check(cu.cuMemFreeAsync(temp, stream))
    check(cu.cuStreamSynchronize(stream))

digest = hashlib.sha256()
out = np.empty(n, np.float32)
for y in ys:
    check(cu.cuMemcpyDtoH(out.ctypes.data, y, size))
    digest.update(out.tobytes())
for buffer in xs + ys:
    check(cu.cuMemFree(buffer))
check(cu.cuStreamDestroy(stream))
check(cu.cuModuleUnload(module))
check(cu.cuDevicePrimaryCtxRelease(device))
report("cuda_python", digest.digest(), 13 * size, mem_get_info_free=int(free), mem_get_info_total=int(total))
