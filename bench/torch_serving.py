"""Serving several models on one GPU (issue 15; part ``serving`` of bench/torch_bench.py): two
Llama-style models, each larger than half the HBM cap and both together larger than it, in
one Pool, take turns as a server switching between them would. The one asked for wakes (its
weights paged in at the PCIe link's speed into the HBM the other gave back), is pinned
(resident with no hooks: the speed of a model never offloaded), decodes, and goes back to
sleep. Every turn's tokens and logits must be those of the same model resident without
tiermem (``serving_identical``).

Metrics: ``serving_wake_GBps`` (median of the turns' wakes) and ``serving_wake_vs_pcie``,
``serving_switch_ms`` (sleep of one and wake of the other), ``serving_pinned_decode_tok_s`` and
``serving_plain_decode_tok_s`` (medians over both models), ``serving_pinned_vs_plain``.
"""

from __future__ import annotations

import statistics
import time

import torch

import tiermem
import tiermem.torch as tt
ROUNDS = 3  # turns of each model


def serving(args, results, tb):
    """The part; ``tb`` is bench/torch_bench.py's module (its helpers: models, decoding)."""
    metrics, ratios, checks = results["metrics"], results["ratios"], results["checks"]
    layers = 2 if args.small else 12
    config = tb.llama_config(2048, 5632, layers, 16, 4)
    models = [tb.llama(config, seed, torch.bfloat16) for seed in (11, 12)]
    size = tb.nbytes(models[0])
    steps, batch = 8, 8
    gen = torch.Generator("cuda").manual_seed(29)
    prompt = torch.randint(0, config.vocab_size, (batch, 32), device="cuda", generator=gen)
    references, plain = [], []
    for model in models:
        tb.decode(model, prompt, steps)  # every KV-cache length seen once
        tokens, logits, step_s = tb.decode(model, prompt, steps)
        references.append((tokens, logits))
        plain.append(batch / step_s)

    pool = tiermem.Pool(hbm_limit=3 * size // 2)  # each model two thirds of the cap: both do not fit
    cap = pool.hbm_cap
    handles = [tt.offload(model, pool, prefetch_bytes=args.prefetch[0]) for model in models]
    assert all(2 * h.bytes > cap >= h.bytes for h in handles), (cap, [h.bytes for h in handles])
    torch.cuda.empty_cache()
    for handle in handles:
        handle.sleep(release_hbm=False)
    wakes, switches, pinned, identical = [], [], [], True
    asleep_at = None
    for turn in range(2 * ROUNDS):
        which = turn % 2
        handle = handles[which]
        t0 = time.perf_counter()
        waking = handle.wake()
        woken = time.perf_counter()
        wakes.append(waking.bytes / (woken - t0) / 1e9)
        if asleep_at is not None:
            switches.append((woken - asleep_at) * 1e3)
        handle.pin()
        tokens, logits, step_s = tb.decode(models[which], prompt, steps)
        identical &= torch.equal(tokens, references[which][0]) and torch.equal(logits, references[which][1])
        pinned.append(batch / step_s)
        asleep_at = time.perf_counter()
        handle.sleep(release_hbm=False)
    for handle in handles:
        handle.remove("cuda")
    del handles, models, pool
    torch.cuda.empty_cache()

    metrics["serving_model_bytes"], metrics["serving_hbm_cap_bytes"] = size, cap
    metrics["serving_wake_GBps"] = statistics.median(wakes)
    metrics["serving_wake_vs_pcie"] = metrics["serving_wake_GBps"] / metrics["raw_h2d_GBps"]
    metrics["serving_switch_ms"] = statistics.median(switches)
    metrics["serving_pinned_decode_tok_s"] = statistics.median(pinned)
    metrics["serving_plain_decode_tok_s"] = statistics.median(plain)
    ratios["serving_pinned_vs_plain"] = metrics["serving_pinned_decode_tok_s"] / metrics["serving_plain_decode_tok_s"]
    checks["serving_identical"] = identical
    tb.log(f"serving two models of {size / tb.GiB:.2f} GiB under a cap of {cap / tb.GiB:.2f} GiB, {ROUNDS} turns each: "
           f"wake {metrics['serving_wake_GBps']:.1f} GB/s ({metrics['serving_wake_vs_pcie']:.2f} of PCIe), "
           f"switch {metrics['serving_switch_ms']:.0f} ms, pinned {metrics['serving_pinned_decode_tok_s']:.1f} tok/s "
           f"against {metrics['serving_plain_decode_tok_s']:.1f} plain; identical {identical}")

