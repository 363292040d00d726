"""The thirty-seventh session (issue 16): PyTorch's memory statistics on its `cudaMallocAsync`
backend, which it reads from the pool's attributes (`cuMemPoolGetAttribute`), plainly and under
`tiermem run`. Ten tensors of 64 MiB, half freed, the cache emptied, the peaks reset; at each
point `memory_allocated`, `memory_reserved` and their peaks, in MiB. Prints one JSON object.

Usage: PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync python3 scripts/gpu/probes/pool_stats.py"""
import json

import torch

MIB = 1 << 20


def snapshot():
    return [torch.cuda.memory_allocated() // MIB, torch.cuda.memory_reserved() // MIB,
            torch.cuda.max_memory_allocated() // MIB, torch.cuda.max_memory_reserved() // MIB]


points = {}
tensors = [torch.full((16 * MIB,), float(i), device="cuda") for i in range(10)]  # 64 MiB each
torch.cuda.synchronize()
points["ten_tensors"] = snapshot()
del tensors[5:]
torch.cuda.synchronize()
points["half_freed"] = snapshot()
torch.cuda.empty_cache()
points["cache_emptied"] = snapshot()
torch.cuda.reset_peak_memory_stats()
points["peaks_reset"] = snapshot()
ok = all(float(t[0]) == float(i) for i, t in enumerate(tensors))
print(json.dumps({"backend": torch.cuda.get_allocator_backend(), "columns": ["allocated", "reserved", "max_allocated",
                  "max_reserved"], "points": points, "bytes_intact": ok}))
