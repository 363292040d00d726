"""Bytes paged in per pass for the torch benchmark's models, counted on the simulated device
(no GPU): the schedule tiermem.torch records, replayed with the window it gives the engine,
against the optimum (model bytes - HBM cap). A check of traffic, not of speed.

Usage: python bench/torch_traffic.py {tied,moe} [--cap GiB] [--prefetch MiB,...] [--pattern]
(TIERMEM_SPREAD_RESIDENT=off: without the planned resident set)
The order of the modules is recorded on a small model of the same architecture; the sizes
are the full model's (built on the meta device). The simulated device holds every byte in
host RAM, so the 18 GiB dense model is left out.
"""

from __future__ import annotations

import argparse

import torch
import transformers
from accelerate import init_empty_weights

import tiermem
import tiermem.torch as tt
from tiermem.units import Site, plan

GiB, MiB = 1 << 30, 1 << 20

MODELS = {  # hidden, MLP, layers, heads, KV heads, vocabulary, HBM cap in GiB (as torch_bench.py)
    "tied": (transformers.LlamaForCausalLM, (3072, 8192, 12, 24, 8), 128256, 1.5),
    "moe": (transformers.MixtralForCausalLM, (2048, 2816, 12, 16, 4), 32000, 2.0),
}


def config(kind: str, small: bool):
    cls, (hidden, mlp, layers, heads, kv), vocab, _ = MODELS[kind]
    if small:
        hidden, mlp, heads, kv, vocab = 64, 128, 4, 2, 512
    kwargs = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=4096)  # fmt: skip
    if kind == "moe":
        return cls, transformers.MixtralConfig(num_local_experts=8, num_experts_per_tok=2, **kwargs)
    return cls, transformers.LlamaConfig(tie_word_embeddings=kind == "tied", **kwargs)


def schedule(kind: str, experts_apart: bool = False) -> tuple[list[list[tuple[str, int]]], int]:
    """Steps (each its units' names and bytes) and the model's bytes; with ``experts_apart``,
    fused experts cut by expert, each expert a step after its block's (tiermem.units)."""
    cls, cfg = config(kind, small=True)
    small = cls(cfg).eval()
    _, sites = plan(small)
    order: list[str] = []
    for site in sites:
        site.module.register_forward_pre_hook(lambda m, a, s=site: order.append(s.name))
    with torch.no_grad():
        small(input_ids=torch.randint(0, 512, (2, 8)))
    cls, cfg = config(kind, small=False)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with init_empty_weights(include_buffers=False):
            big = cls(cfg)
    finally:
        torch.set_default_dtype(previous)
    big.tie_weights()
    units, sites = plan(big, experts_apart=experts_apart)
    by_name: dict[str, Site] = {s.name: s for s in sites}
    size = {id(u): sum(o.nbytes() for o in u.tensors) for u in units}
    for site in sites:
        for experts in site.experts:
            size.update({id(u): s for u, s in zip(experts.units, experts.sizes)})
    steps = []
    for n in order:
        site = by_name[n]
        steps.append([(u.name, size[id(u)]) for u in site.units if not u.lazy])
        steps += [[(u.name, size[id(u)])] for experts in site.experts for u in experts.units]
    return steps, sum(size.values())


def traffic(kind: str, cap: int, prefetch: int, passes: int = 3, experts_apart: bool = False,
            pattern: list | None = None) -> tuple[float, int]:
    """(bytes paged in during the last pass, the window used) with Offload's window rules;
    ``pattern`` gets a mark per step of the last pass: '.' nothing paged in, '+' under 8 MiB,
    '#' more (where the resident steps lie along the pass)."""
    steps, _ = schedule(kind, experts_apart)
    pool = tiermem.Pool(backend="sim", hbm_limit=cap)
    buffers = {}
    for step in steps:
        for name, nbytes in step:
            if name not in buffers:
                buffers[name] = pool.alloc(nbytes, name=name)
                buffers[name].write(b"\0")  # written, so that streaming copies bytes
    pool.set_schedule([[buffers[n] for n, _ in step] for step in steps])
    window = min(prefetch, cap // tt.WINDOW_SHARE)
    moved = 0
    for _ in range(passes):
        before = pool.stats()["transfers"]["bytes_in"]
        marks = []
        for i, step in enumerate(steps):
            at = pool.stats()["transfers"]["bytes_in"]
            pool.advance(i, window)
            held = list({id(buffers[n]): buffers[n] for n, _ in step}.values())
            for b in held:
                pool.acquire(b, 0, False)
            pool.release(held, 0)
            paged = pool.stats()["transfers"]["bytes_in"] - at
            marks.append("." if paged == 0 else "+" if paged < 8 * MiB else "#")
        moved = pool.stats()["transfers"]["bytes_in"] - before
    if pattern is not None:
        pattern[:] = marks
    return moved, window


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=sorted(MODELS))
    parser.add_argument("--cap", type=float, help="HBM cap in GiB (default: the benchmark's)")
    parser.add_argument("--prefetch", default="256", help="prefetch_bytes to try, in MiB, comma-separated")
    parser.add_argument("--experts-apart", action="store_true", help="fused experts cut by expert (tiermem.units)")
    parser.add_argument("--pattern", action="store_true", help="also print what each step of the last pass paged in")
    args = parser.parse_args()
    cap = int((args.cap or MODELS[args.kind][3]) * GiB)
    _, total = schedule(args.kind, args.experts_apart)
    for p in args.prefetch.split(","):
        marks: list = []
        moved, window = traffic(args.kind, cap, int(float(p) * MiB), experts_apart=args.experts_apart, pattern=marks)
        print(f"{args.kind}: model {total / GiB:.2f} GiB, cap {cap / GiB:.2f} GiB, prefetch {p} MiB (window "
              f"{window / MiB:.0f} MiB): {moved / GiB:.3f} GiB per pass = {moved / (total - cap):.3f}x the optimum")
        if args.pattern:
            print("  " + "".join(marks))


if __name__ == "__main__":
    main()
