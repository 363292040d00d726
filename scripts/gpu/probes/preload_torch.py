"""An unmodified PyTorch program for `tiermem run` (issue 16, stage 1): a small MLP trained
for a few steps on fixed data, with a working set (weights, activations, Adam state) of
about 3 GiB. Run once plainly and once under `tiermem run --hbm-limit` below that: the
losses must be bitwise identical, and the run under a budget must not fail for lack of memory
(its allocations beyond the budget are mapped in host memory). Prints one JSON line.
"""
import json
import time

import torch

torch.manual_seed(0)
free, total = torch.cuda.mem_get_info()
width, layers, batch = 8192, 8, 4096
model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU()) for _ in range(layers)]).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
x = torch.randn(batch, width, device="cuda")
y = torch.randn(batch, width, device="cuda")
losses, times = [], []
for step in range(6):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
    times.append(time.perf_counter() - t0)
print(json.dumps({
    "mem_get_info_total": total, "mem_get_info_free_at_start": free,
    "max_memory_allocated": torch.cuda.max_memory_allocated(), "max_memory_reserved": torch.cuda.max_memory_reserved(),
    "losses": losses, "step_s_median": sorted(times[1:])[len(times[1:]) // 2],
}))
