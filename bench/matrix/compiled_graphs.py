"""`torch.compile(mode="reduce-overhead")`, unmodified: Inductor's kernels replayed as CUDA graphs
(CUDA graph trees: a private memory pool, captured once per shape, replayed every step) — the way
inference servers and fast decoding loops run. A stack of transformer-like blocks decodes 60
steps, each step's output fed back in, and a second shape is captured halfway; the digest is the
outputs. Inductor's deterministic mode is on (kernels chosen by heuristics, not timing them), so
the results compare bitwise."""
import time

import torch
import torch._inductor.config

from common import blocks, report

torch._inductor.config.deterministic = True

torch.manual_seed(0)
model = blocks(2048, 12).eval()  # 1.2 GiB of weights
step = torch.compile(model, mode="reduce-overhead")
gen = torch.Generator(device="cuda").manual_seed(1)
outputs, seconds = [], []
with torch.no_grad():
    for batch in (64, 96):  # a second shape: a second graph
        x = torch.randn(batch, 2048, device="cuda", generator=gen)
        for _ in range(30):
            started = time.perf_counter()
            x = step(x).clone()  # the graph's output buffer is reused by its next replay
            x = x / x.norm(dim=-1, keepdim=True)
            outputs.append(x[:4].float().cpu())  # a synchronization per step, as a decoder's
            seconds.append(time.perf_counter() - started)
digest = torch.cat(outputs).numpy().tobytes()
steady = sorted(seconds[40:])  # the second shape's steps, once captured
report("compiled_graphs", digest, torch.cuda.max_memory_reserved(), step_s=round(steady[len(steady) // 2], 5))
