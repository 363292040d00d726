"""Numba's CUDA target: a kernel written in Python, compiled by Numba and launched through the
driver API that Numba loads itself (not through PyTorch or the CUDA runtime). Sixteen arrays of
32 MiB, eight rounds of y = y * 0.5 + x over them, then a reduction on the device."""
import sys

import numpy as np

if not hasattr(np, "row_stack"):  # numba-cuda refers to it when compiling; NumPy 2.4 removed it
    np.row_stack = np.vstack
try:
    from numba import cuda
except ImportError:
    print('{"skipped": "Numba is not installed"}')
    sys.exit(0)

from common import report


@cuda.jit
def blend(x, y):
    i = cuda.grid(1)
    if i < y.size:
        y[i] = y[i] * 0.5 + x[i]


@cuda.jit
def partial_sums(y, out):
    i = cuda.grid(1)
    if i < out.size:
        s = 0.0
        for j in range(i * 1024, min((i + 1) * 1024, y.size)):
            s += y[j]
        out[i] = s


n = 8 << 20  # float32: 32 MiB an array
arrays = [cuda.to_device(np.arange(n, dtype=np.float32) % (97 + k)) for k in range(16)]
for _ in range(8):
    for k in range(16):
        blend[(n + 255) // 256, 256](arrays[k], arrays[(k + 1) % 16])
sums = cuda.device_array((n + 1023) // 1024, dtype=np.float32)
result = []
for a in arrays:
    partial_sums[(sums.size + 255) // 256, 256](a, sums)
    result.append(sums.copy_to_host())
report("numba", np.concatenate(result).tobytes(), 17 * n * 4)
