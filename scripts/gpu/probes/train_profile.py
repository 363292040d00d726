"""Where an offloaded training step's time goes: `bench/torch_bench.py`'s training loop (a
0.85 B-parameter Llama in fp32 with AdamW, 13.6 GB of state under an 8 GiB cap), each step cut
into forward, backward and the optimizer's step, each phase timed (synchronized) with the
engine's transfer counters before and after. Prints one JSON object: per step and phase the
seconds, bytes in and out, evictions, and the milliseconds acquires waited for page-ins
(`stall_ms`) and for evictions (`evict_wait_ms`); the median of the steps after the first.

    python3 scripts/gpu/probes/train_profile.py [--small] [--prefetch-mib 256] [--steps 5] [--act-prefetch 2]
        [--no-activations] [--resident]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

import torch  # noqa: E402

import tiermem  # noqa: E402
import tiermem.torch as tt  # noqa: E402
from torch_bench import llama, llama_config  # noqa: E402

COUNTERS = ("bytes_in", "bytes_out", "evictions", "stall_ms", "evict_wait_ms", "page_ins", "zero_fills", "map_ms", "discarded", "handed_over")


def counters(pool) -> dict:
    if pool is None:
        return {k: 0 for k in COUNTERS}
    t = pool.stats()["transfers"]
    return {k: t.get(k, 0) for k in COUNTERS}  # (older wheels lack some)


def phase(pool, fn) -> tuple[dict, object]:
    """Runs `fn` synchronized: its seconds and the engine's counters' growth, and its result."""
    torch.cuda.synchronize()
    before, t0 = counters(pool), time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    seconds, after = time.perf_counter() - t0, counters(pool)
    row = {"s": round(seconds, 4)}
    row.update({k: round(after[k] - before[k], 2) for k in COUNTERS})
    return row, out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--prefetch-mib", type=int, default=256)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--act-prefetch", type=int, default=2, help="offload_activations' prefetch (saved tensors paged in ahead)")
    parser.add_argument("--no-activations", action="store_true", help="activations stay plain PyTorch memory")
    parser.add_argument("--resident", action="store_true", help="no tiermem: the model resident")
    parser.add_argument("--activations-only", type=int, default=0, metavar="MIB",
                        help="the model resident, only its activations in a Pool capped at MIB (no offload, no schedule)")
    args = parser.parse_args()
    config = llama_config(*((512, 1408, 4, 8, 2) if args.small else (2048, 5632, 16, 16, 4)))
    cap = (512 << 20) if args.small else (8 << 30)
    batch, seq = 4, 512
    model = llama(config, 2, torch.float32).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    pool = handle = None
    if args.activations_only:
        cap = args.activations_only << 20
        pool = tiermem.Pool(hbm_limit=cap)
    elif not args.resident:
        pool = tiermem.Pool(hbm_limit=cap)
        handle = tt.offload(model, pool, prefetch_bytes=args.prefetch_mib << 20, optimizer=opt)
        torch.cuda.empty_cache()

    def update():
        if handle is not None:
            handle.step()
        else:
            opt.step()
            opt.zero_grad(set_to_none=False)

    gen = torch.Generator("cuda").manual_seed(11)
    steps = []
    for _ in range(args.steps):
        ids = torch.randint(0, config.vocab_size, (batch, seq), device="cuda", generator=gen)
        acts = tt.offload_activations(pool, prefetch=args.act_prefetch) if pool is not None and not args.no_activations else torch.enable_grad()
        with acts:
            fwd, loss = phase(pool, lambda: model(input_ids=ids, labels=ids).loss)
        bwd, _ = phase(pool, loss.backward)
        upd, _ = phase(pool, update)
        steps.append({"forward": fwd, "backward": bwd, "step": upd, "loss": loss.item()})
        print(json.dumps(steps[-1]), file=sys.stderr, flush=True)
    later = steps[1:] or steps
    median = {p: {k: statistics.median(s[p][k] for s in later) for k in later[0][p]} for p in ("forward", "backward", "step")}
    total = statistics.median(sum(s[p]["s"] for p in ("forward", "backward", "step")) for s in later)
    print(json.dumps({"args": vars(args), "cap": cap, "step_s": total, "median": median, "steps": steps}))


if __name__ == "__main__":
    main()
