"""How fast a grouped GEMM runs over experts' weights laid out with gaps between experts (each
expert cut to whole 2 MiB chunks, tiermem.units) against the contiguous layout: bench-size
Mixtral experts, decode-size rows. Prints one JSON line."""
import json
import time

import torch

E, H, MLP, ROWS = 8, 2048, 2816, 32
grouped = getattr(torch.nn.functional, "grouped_mm", None) or torch._grouped_mm
x = torch.randn(ROWS, H, device="cuda", dtype=torch.bfloat16)
ids = torch.sort(torch.randint(0, E, (ROWS,), device="cuda")).values
offs = torch.cumsum(torch.bincount(ids, minlength=E), 0).to(torch.int32)
dense = torch.randn(E, 2 * MLP, H, device="cuda", dtype=torch.bfloat16)
part = 34 << 20  # bytes per expert part, as the benchmark's model is cut
span = torch.zeros(E * part // 2, device="cuda", dtype=torch.bfloat16)
gapped = span.as_strided(dense.shape, (part // 2, H, 1))
gapped.copy_(dense)


def timed(w, n=200):
    for _ in range(10):
        grouped(x, w.transpose(-2, -1), offs=offs)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        out = grouped(x, w.transpose(-2, -1), offs=offs)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6, out


(c_us, c_out), (g_us, g_out) = timed(dense), timed(gapped)
print(json.dumps({"contiguous_us": c_us, "gapped_us": g_us, "identical": bool(torch.equal(c_out, g_out)), "torch": torch.__version__}))
