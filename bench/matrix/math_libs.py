"""CUDA's math libraries through PyTorch, unmodified: cuSOLVER (eigh, SVD, Cholesky, QR, LU
solve), cuFFT (a 3-D FFT and its inverse), cuSPARSE (a sparse-dense product), batched cuBLAS and
a sort — each library allocates its own workspaces through the runtime, some inside the
library, which the preload routes like any other allocation.

The digest covers each operation whose result this run computed twice bitwise alike (a library
free to pick another algorithm per call would make the capped run differ for reasons of its own,
not tiermem's); those that were not are named in the report, and left out of the digest."""
import torch

from common import report, reproducible_digest

torch.manual_seed(0)
g = torch.Generator(device="cuda").manual_seed(1)
keep = []  # inputs and results stay alive: the peak is ~1.5 GB, moved chunk by chunk under a cap


def ops():
    n = 2048
    a = torch.randn(n, n, device="cuda", generator=g, dtype=torch.float64)
    spd = a @ a.T + n * torch.eye(n, device="cuda", dtype=torch.float64)
    rhs = torch.randn(n, 64, device="cuda", generator=g, dtype=torch.float64)
    cube = torch.randn(256, 256, 256, device="cuda", generator=g)
    dense = torch.randn(8192, 512, device="cuda", generator=g)
    rows = torch.randint(0, 8192, (2, 400_000), device="cuda", generator=g)
    sparse = torch.sparse_coo_tensor(rows, torch.randn(400_000, device="cuda", generator=g), (8192, 8192)).coalesce()
    batch = torch.randn(64, 512, 512, device="cuda", generator=g)
    keys = torch.randn(1 << 25, device="cuda", generator=g)
    keep.extend([a, spd, rhs, cube, dense, sparse, batch, keys])
    return {
        "eigh": lambda: torch.linalg.eigh(spd).eigenvalues,
        "svd": lambda: torch.linalg.svdvals(a),
        "cholesky": lambda: torch.linalg.cholesky(spd),
        "qr": lambda: torch.linalg.qr(a).R,
        "solve": lambda: torch.linalg.solve(a, rhs),
        "fft": lambda: torch.fft.ifftn(torch.fft.fftn(cube) * 0.5).real,
        "sparse": lambda: torch.sparse.mm(sparse, dense),
        "bmm": lambda: torch.bmm(batch, batch.transpose(1, 2)),
        "sort": lambda: torch.sort(keys).values,
    }


digest, unstable = reproducible_digest(ops(), lambda t: t.cpu().numpy().tobytes(), torch.cuda.synchronize, keep)
report("math_libs", digest, torch.cuda.max_memory_reserved(), unstable=unstable)
