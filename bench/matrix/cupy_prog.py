"""CuPy: an FFT, elementwise kernels and reductions over 2^26 floats (its own memory pool)."""
import sys

try:
    import cupy as cp
except ImportError:
    print('{"skipped": "CuPy is not installed"}')
    sys.exit(0)

from common import report

rs = cp.random.RandomState(0)
x = rs.standard_normal(1 << 26, dtype=cp.float32)
y = cp.abs(cp.fft.rfft(x)).astype(cp.float32)
z = cp.sqrt(y * y + 1.0) - y
parts = cp.stack([z.sum(), z.max(), (x * x).mean()])
result = cp.concatenate([z[:: 1 << 10], parts])
cp.cuda.Device().synchronize()
report("cupy", cp.asnumpy(result).tobytes(), cp.get_default_memory_pool().total_bytes())
