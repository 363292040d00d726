"""Where the host time of tiermem.torch's hooks goes on the GPU machine (issue 15: the tied
and MoE decodes are host-bound on slow hosts). The benchmark's tied Llama decoded with every
weight resident: plain (never offloaded), through tiermem, through tiermem with the hooks'
bodies emptied (PyTorch's hook dispatch alone), pinned; then one decode under cProfile.
Prints and writes OUT/hook-time.txt.

Usage (on the GPU machine): python3 scripts/gpu/probes/hook_time.py OUT
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import torch_bench as tb  # noqa: E402

import tiermem  # noqa: E402
import tiermem.torch as tt  # noqa: E402

GiB = 1 << 30


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    config = tb.llama_config(3072, 8192, 12, 24, 8)
    config.vocab_size, config.tie_word_embeddings = 128256, True
    model = tb.llama(config, 3, torch.bfloat16)
    prompt = torch.randint(0, config.vocab_size, (16, 32), device="cuda", generator=torch.Generator("cuda").manual_seed(17))
    lines = []

    def speed(name):
        tb.decode(model, prompt, 8)
        _, _, step_s = tb.decode(model, prompt, 8)
        lines.append(f"{name}: {prompt.shape[0] / step_s:.1f} tok/s, {step_s * 1e3:.2f} ms a pass")
        print(lines[-1], flush=True)
        return step_s

    plain = speed("plain")
    pool = tiermem.Pool(hbm_limit=tb.nbytes(model) + GiB)
    handle = tt.offload(model, pool, prefetch_bytes=256 << 20)
    torch.cuda.empty_cache()
    hooked = speed("through tiermem, all resident")
    sites = len(handle.sites)
    lines.append(f"{sites} sites: {(hooked - plain) / sites * 1e6:.1f} us a site over plain")
    enter, exit_ = tt.Offload._enter, tt.Offload._exit
    tt.Offload._enter = lambda self, key, phase: key.held.append([])
    tt.Offload._exit = lambda self, key: key.held.pop() if key.held else None
    empty = speed("hooks with empty bodies (PyTorch's dispatch and our closures)")
    tt.Offload._enter, tt.Offload._exit = enter, exit_
    lines.append(f"dispatch {(empty - plain) / sites * 1e6:.1f} us a site, bodies {(hooked - empty) / sites * 1e6:.1f} us a site")
    handle.pin()
    speed("pinned")
    handle.unpin()
    profile = cProfile.Profile()
    with torch.no_grad():
        profile.enable()
        tb.decode(model, prompt, 8)
        profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
    lines.append(text.getvalue())
    print("\n".join(lines[-2:]))
    (out / "hook-time.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
