"""A cuBLAS GEMM loop: C = 0.5 C + A B / n, twenty times, over three 8192² fp32 matrices (768 MiB)."""
import torch

from common import report

torch.manual_seed(0)
n = 8192
a, b = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
c = torch.zeros(n, n, device="cuda")
for _ in range(20):
    c = torch.addmm(c, a, b, beta=0.5, alpha=1.0 / n)
torch.cuda.synchronize()
report("cublas_gemm_loop", c.cpu().numpy().tobytes(), torch.cuda.max_memory_reserved())
