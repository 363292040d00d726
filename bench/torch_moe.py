"""The Mixtral-style part of bench/torch_bench.py (issue 15, part ``moe``): models of 8 experts,
2 per token, at least 1.5x their HBM cap, decoded resident, then offloaded (each sparse block's
router and fused tensors their own steps: tiermem.units), at batch 16 against the PCIe bound;
tokens and logits must be the resident model's (``moe_identical``). ``mixtral`` builds them for
the probes too (scripts/gpu/probes/).
"""

from __future__ import annotations

import gc

import torch
import transformers

import tiermem
import tiermem.torch as tt

GiB, MiB = 1 << 30, 1 << 20


# The MoE shapes: (hidden, expert MLP, layers, heads, KV heads) and the HBM cap.
# "12-layer": each sparse block is 7.2% of the model (264 MiB of 3.57 GiB, cap 2 GiB: 1.79x).
# "32-layer" has Mixtral-8x7B's depth and proportions scaled down: each block 3.0% of the model
# as in Mixtral (168 MiB of 5.53 GiB, cap 3 GiB). A block's fused up projection must be
# resident whole while its grouped GEMM runs, so a pass moves at least (model - cap + that
# projection): 1.11x the optimum for the first (1.118x measured), 1.04x for the second; but the
# second decodes all resident below its PCIe bound (HF's decode of 32 sparse layers at batch 16
# costs the host more than the link's time), so it measures the hooks and compute, not the
# streaming (BENCHMARKS.md, seventeenth session). "mixtral-depth" has Mixtral's depth and block
# share (2.8%: 576 MiB of 19.9 GiB, cap 11 GiB: 1.81x; its up projection 384 MiB, so at least
# 1.04x the optimum) at a width where the link sets the pace
# (each layer's 280 MiB streamed take the link ~5 ms, HF's host code ~2 ms). Asked for with
# --moe-shapes; the first is the headline.
MOE_SHAPES = {
    "12-layer": ((2048, 2816, 12, 16, 4), 2 * GiB),
    "32-layer": ((1024, 3584, 32, 16, 4), 3 * GiB),
    "mixtral-depth": ((3072, 4096, 32, 24, 8), 11 * GiB),
}


def mixtral(small: bool, shape: str = "12-layer"):
    """The benchmark's Mixtral-style model (8 experts, 2 per token; random bf16 weights, seeded)
    on the GPU, its HBM cap and its config; ``shape`` one of MOE_SHAPES."""
    (hidden, mlp, layers, heads, kv), cap = ((512, 1024, 4, 8, 2), 64 * MiB) if small else MOE_SHAPES[shape]
    config = transformers.MixtralConfig(
        vocab_size=32000, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, num_local_experts=8, num_experts_per_tok=2,
        max_position_embeddings=4096,
    )  # fmt: skip
    torch.manual_seed(4)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = transformers.MixtralForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(previous)
    return model, cap, config


def mixture_of_experts(args, results, tb):
    """A Mixtral-style model (8 experts, 2 per token) at least 1.5x the cap: resident, then
    offloaded (each sparse block one step: tiermem.units), decoded at batch 16. The headline
    (``moe_*``) is the first of ``--moe-shapes``; the others are recorded as ``moe_<shape>_*``.
    ``tb`` is bench/torch_bench.py's module (its helpers: decoding against the bound)."""
    shapes = args.moe_shapes[:1] if args.small else args.moe_shapes  # one small model whatever the shape
    for index, shape in enumerate(shapes):
        moe_decode(args, results, "moe" if index == 0 else f"moe_{shape.replace('-', '_')}", shape, tb)


def moe_decode(args, results, key, shape, tb):
    metrics, ratios, checks = results["metrics"], results["ratios"], results["checks"]
    model, cap, config = mixtral(args.small, shape)
    if args.experts_implementation:
        model.config._experts_implementation = args.experts_implementation
    size = tb.nbytes(model)
    gen = torch.Generator("cuda").manual_seed(23)
    prompt = torch.randint(0, config.vocab_size, (16, 32), device="cuda", generator=gen)
    tb.decode(model, prompt, 8)  # every KV-cache length seen once, as before the offloaded decode is timed
    ref_tokens, ref_logits, plain_s = tb.decode(model, prompt, 8)
    # The model resident without tiermem: the speed its compute allows on this host (the PCIe
    # bound may be beyond it), beside the same with every weight resident through tiermem.
    metrics[f"{key}_plain_resident_decode_tok_s"] = prompt.shape[0] / plain_s
    pool = tiermem.Pool(hbm_limit=cap)
    handle = tt.offload(model, pool, prefetch_bytes=args.prefetch[0])
    torch.cuda.empty_cache()
    metrics[f"{key}_model_bytes"], metrics[f"{key}_hbm_cap_bytes"], metrics[f"{key}_prefetch_bytes"] = size, cap, handle.window_bytes
    metrics[f"{key}_layers"] = config.num_hidden_layers
    results[f"{key}_experts_implementation"] = getattr(model.config, "_experts_implementation", None)
    metrics[f"{key}_experts_cut"] = sum(len(s.experts) for s in handle.sites)
    tokens, logits, ratios[f"{key}_vs_pcie_bound"] = tb.decode_vs_bound(metrics, key, model, pool, prompt, 8, size, cap)
    checks[f"{key}_identical"] = torch.equal(tokens, ref_tokens) and torch.equal(logits, ref_logits)
    tb.log(f"MoE, {shape} ({config.num_hidden_layers} layers, {size / GiB:.2f} GiB, cap {cap / GiB:.2f}): "
        f"{metrics[f'{key}_decode_tok_s']:.1f} tok/s = {ratios[f'{key}_vs_pcie_bound']:.2f} of the PCIe bound, "
        f"window {handle.window_bytes / MiB:.0f} MiB, {metrics[f'{key}_traffic_vs_optimum']:.2f}x the optimum's traffic; "
        f"resident without tiermem {metrics[f'{key}_plain_resident_decode_tok_s']:.1f} tok/s")
    handle = tb.window_sweep(args, metrics, key, handle, model, pool, prompt, 8, size, cap)
    pinned = tb.where_time_goes(metrics, key, handle, pool, model, prompt, 8, size, cap)
    checks[f"{key}_pinned_identical"] = all(map(torch.equal, pinned, (tokens, logits)))
    del model, handle, pool
    gc.collect()
    torch.cuda.empty_cache()


