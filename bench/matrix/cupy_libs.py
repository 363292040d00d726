"""CUDA's math libraries through CuPy, unmodified: cuRAND (CuPy's generator), cuSOLVER (SVD, LU
solve, eigh), cuSPARSE (a CSR product with a dense matrix and a CSR-CSR product), cuFFT (2-D, its
plan cached) and cuBLAS — each drawing its workspaces from CuPy's memory pool or allocating its
own through the runtime. The digest covers each result that this run computed twice bitwise
alike; those that were not are named in the report and left out (see math_libs.py)."""
import sys

try:
    import cupy as cp
    import cupyx.scipy.sparse as sparse
except ImportError:
    print('{"skipped": "CuPy is not installed"}')
    sys.exit(0)

from common import report, reproducible_digest

rs = cp.random.RandomState(seed=0)  # cuRAND's XORWOW generator
n = 2048
a = rs.standard_normal((n, n), dtype=cp.float64)
spd = a @ a.T + n * cp.eye(n)
rhs = rs.standard_normal((n, 64), dtype=cp.float64)
image = rs.standard_normal((4096, 4096), dtype=cp.float32)
csr = sparse.random(16384, 16384, density=0.002, format="csr", dtype=cp.float32, random_state=rs)
dense = rs.standard_normal((16384, 256), dtype=cp.float32)
keep = [a, spd, rhs, image, csr, dense]
ops = {
    "svd": lambda: cp.linalg.svd(a, compute_uv=False),
    "solve": lambda: cp.linalg.solve(a, rhs),
    "eigh": lambda: cp.linalg.eigvalsh(spd),
    "spmm": lambda: csr @ dense,
    "spgemm": lambda: (csr @ csr).toarray()[:64],
    "fft2": lambda: cp.abs(cp.fft.ifft2(cp.fft.fft2(image) * 0.5)).astype(cp.float32),
    "gemm": lambda: image @ image.T,
}
digest, unstable = reproducible_digest(ops, lambda a: cp.asnumpy(a).tobytes(), cp.cuda.Device().synchronize, keep)
report("cupy_libs", digest, cp.get_default_memory_pool().total_bytes(), unstable=unstable)
