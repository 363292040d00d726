"""Where the host time of an all-resident MoE decode goes, through tiermem with the experts
moved whole and cut by expert: the benchmark's Mixtral (bench/torch_bench.py) under a cap above
the model, one decode step per profile, cProfile's top entries. Usage: moe_host_profile.py OUT"""
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import torch  # noqa: E402
import transformers  # noqa: E402
import torch_bench as tb  # noqa: E402
import torch_moe  # noqa: E402

import tiermem  # noqa: E402
import tiermem.torch as tt  # noqa: E402
import tiermem.units  # noqa: E402

model, _, config = torch_moe.mixtral(False)
gen = torch.Generator("cuda").manual_seed(23)
prompt = torch.randint(0, config.vocab_size, (16, 32), device="cuda", generator=gen)
result = {}
with torch.no_grad():
    _, _, s = tb.decode(model, prompt, 4)
    result["resident_no_tiermem_ms"] = s * 1e3
    for arm in ("whole", "cut", "whole", "cut"):
        tiermem.units.EXPERTS_APART = arm == "cut"
        pool = tiermem.Pool(hbm_limit=8 << 30)
        handle = tt.offload(model, pool, prefetch_bytes=256 << 20)
        tb.decode(model, prompt, 4)
        _, _, s = tb.decode(model, prompt, 8)
        cache = transformers.DynamicCache()
        out = model(input_ids=prompt, past_key_values=cache, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        torch.cuda.synchronize()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(4):
            out = model(input_ids=token, past_key_values=cache, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
            torch.cuda.synchronize()
        profile.disable()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
        result[f"{arm}_ms"] = result.get(f"{arm}_ms", []) + [s * 1e3]
        result[f"{arm}_profile"] = text.getvalue()
        handle.remove("cuda")
        del handle, pool
Path(sys.argv[1]).write_text(json.dumps(result, indent=1))
print(json.dumps({k: v for k, v in result.items() if not k.endswith("profile")}))
print(result["cut_profile"][:6000])
