"""Many small buffers: PyTorch with its caching allocator off (every tensor a cudaMalloc and a
cudaFree), 100,000 tensors of 1 to 64 KiB, each filled, summed and freed."""
import os

os.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
import torch  # noqa: E402

from common import report  # noqa: E402

acc = torch.zeros(1, dtype=torch.float64, device="cuda")
for i in range(100_000):
    n = 256 * (1 + i % 64)  # 1 to 64 KiB of float32
    t = torch.full((n,), float(i % 97), device="cuda")
    acc += t.sum(dtype=torch.float64)
    del t
torch.cuda.synchronize()
report("small_buffers", acc.cpu().numpy().tobytes(), 64 << 20, allocations=100_000)
