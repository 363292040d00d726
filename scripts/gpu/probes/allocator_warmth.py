"""Is a decode step slower the first time PyTorch sees its KV cache's length, and why? The
decode-timeline probe found the tied and MoE models' steps 1.8x slower for the first eight
steps after offloading than for later ones of the same lengths. Here each model decodes eight
steps four times: new lengths, the same again, the same after torch.cuda.empty_cache(), and
the same again; resident first, then offloaded under the benchmark's cap. Prints JSON (step
medians in ms). A probe, not a benchmark."""
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import decode_timeline as dt  # noqa: E402
import torch_bench as tb  # noqa: E402

import tiermem  # noqa: E402
import tiermem.torch as tt  # noqa: E402

torch.set_grad_enabled(False)


def rounds(model, prompt):
    out = {}
    tb.decode(model, prompt, 2)
    out["new_lengths"] = tb.decode(model, prompt, 8)[2] * 1e3
    out["seen_lengths"] = tb.decode(model, prompt, 8)[2] * 1e3
    torch.cuda.empty_cache()
    out["after_empty_cache"] = tb.decode(model, prompt, 8)[2] * 1e3
    out["seen_again"] = tb.decode(model, prompt, 8)[2] * 1e3
    return {k: round(v, 2) for k, v in out.items()}


results = {}
for name, make in (("tied", dt.tied_model), ("moe", dt.moe_model)):
    model, cap, vocab = make()
    gen = torch.Generator("cuda").manual_seed(17)
    prompt = torch.randint(0, vocab, (16, 32), device="cuda", generator=gen)
    results[f"{name}_resident"] = rounds(model, prompt)
    pool = tiermem.Pool(hbm_limit=cap)
    handle = tt.offload(model, pool, prefetch_bytes=cap)
    torch.cuda.empty_cache()
    results[f"{name}_offloaded"] = rounds(model, prompt)
    print(json.dumps({k: v for k, v in results.items() if k.startswith(name)}), flush=True)
    del model, handle, pool
    torch.cuda.empty_cache()
