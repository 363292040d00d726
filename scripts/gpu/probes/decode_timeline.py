"""Where a short decode pass loses time under tiermem (issue 15: the tied and MoE models reach
0.3-0.6 of the PCIe bound while they move 1.2x the optimum's bytes). Builds the benchmark's tied
Llama and Mixtral-style model (random weights), offloads each under the benchmark's cap, warms
up, then records two decode steps with torch.profiler (CUPTI sees tiermem's copies too) and
each engine call as a named range. Per step it reports: wall time, time the link copied
host-to-device, time kernels ran, time neither did (the idle gaps, with the host ranges that
cover each), and the host time inside each engine call. A probe, not a benchmark.

Usage: python scripts/gpu/probes/decode_timeline.py OUT_DIR [--share 8,4,2] [--models tied,moe] [--traces]
Writes OUT_DIR/decode-timeline.json (with --traces, the gzipped Chrome traces in one tar file).
"""

import argparse
import gzip
import tarfile
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import torch_bench as tb  # noqa: E402
import torch_moe  # noqa: E402

import tiermem  # noqa: E402
import tiermem.torch as tt  # noqa: E402

MiB, GiB = tb.MiB, tb.GiB


class _Named:
    """Stands in for a Pool: each engine call becomes a profiler range `tiermem.<name>`."""

    def __init__(self, pool):
        self._pool = pool

    def __getattr__(self, name):
        fn = getattr(self._pool, name)
        if not callable(fn):
            return fn

        def call(*args, **kwargs):
            with torch.profiler.record_function(f"tiermem.{name}"):
                return fn(*args, **kwargs)

        return call


def tied_model():
    config = tb.llama_config(3072, 8192, 12, 24, 8)
    config.vocab_size, config.tie_word_embeddings = 128256, True
    return tb.llama(config, 3, torch.bfloat16), int(1.5 * GiB), config.vocab_size


def moe_model():
    model, cap, config = torch_moe.mixtral(small=False)
    return model, cap, config.vocab_size


def union(intervals):
    """Sorted, merged [start, end) intervals."""
    merged = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return merged


def length(intervals):
    return sum(e - s for s, e in intervals)


def clip(intervals, lo, hi):
    return [[max(s, lo), min(e, hi)] for s, e in intervals if e > lo and s < hi]


def analyse(trace_path, steps):
    """Per profiled step (the `decode_step` ranges): link, kernel and idle time, in ms; and how
    many events of each category the trace holds (a trace without copies says so)."""
    events = json.loads(Path(trace_path).read_text())["traceEvents"]
    categories = {}
    for e in events:
        categories[e.get("cat", "?")] = categories.get(e.get("cat", "?"), 0) + 1
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    step_ranges = sorted((e["ts"], e["ts"] + e["dur"]) for e in spans if e["name"] == "decode_step")
    copies = [(e["ts"], e["ts"] + e["dur"], e["name"]) for e in spans if e.get("cat") == "gpu_memcpy"]
    h2d = [(s, e) for s, e, n in copies if "HtoD" in n]
    kernels = [(e["ts"], e["ts"] + e["dur"]) for e in spans if e.get("cat") == "kernel"]
    host = [(e["ts"], e["ts"] + e["dur"], e["name"]) for e in spans if e.get("cat") in ("user_annotation", "cpu_op")]
    out = []
    for lo, hi in step_ranges[:steps]:
        link, compute = union(clip(h2d, lo, hi)), union(clip(kernels, lo, hi))
        busy = union(link + compute)
        gaps, cursor = [], lo
        for s, e in busy:
            if s - cursor > 200:
                gaps.append((cursor, s))
            cursor = max(cursor, e)
        if hi - cursor > 200:
            gaps.append((cursor, hi))
        described = []
        for s, e in sorted(gaps, key=lambda g: g[0] - g[1])[:8]:
            covering = sorted({n for hs, he, n in host if hs < e and he > s and n.startswith("tiermem.")})
            described.append({"start_ms": round((s - lo) / 1e3, 2), "ms": round((e - s) / 1e3, 2), "tiermem_calls": covering})
        calls = {}
        for hs, he, n in host:
            if n.startswith("tiermem.") and lo <= hs < hi:
                calls[n] = round(calls.get(n, 0) + (he - hs) / 1e3, 2)
        out.append({
            "wall_ms": round((hi - lo) / 1e3, 2),
            "h2d_busy_ms": round(length(link) / 1e3, 2),
            "kernels_busy_ms": round(length(compute) / 1e3, 2),
            "idle_ms": round((hi - lo - length(busy)) / 1e3, 2),
            "overlap_ms": round((length(link) + length(compute) - length(busy)) / 1e3, 2),
            "largest_gaps": described,
            "host_ms_in_engine_calls": calls,
            "h2d_copies": len(clip(h2d, lo, hi)),
        })
    return {"categories": categories, "steps": out}


def settling(model, pool, prompt, steps):
    """Each decode step's milliseconds and bytes brought in, from the first pass after
    offloading: how many passes the engine needs to reach its steady state."""
    cache = transformers.DynamicCache()
    out = model(input_ids=prompt, past_key_values=cache, use_cache=True)
    token = out.logits[:, -1:].argmax(-1)
    ms, counters = [], {}
    for step in range(steps):
        if step % 8 == 0:  # a fresh cache now and then: the attention's cost stays that of a short decode
            cache = transformers.DynamicCache()
            out = model(input_ids=prompt, past_key_values=cache, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
        torch.cuda.synchronize()
        before, t0 = pool.stats()["transfers"], time.perf_counter()
        out = model(input_ids=token, past_key_values=cache, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        torch.cuda.synchronize()
        ms.append(round((time.perf_counter() - t0) * 1e3, 2))
        after = pool.stats()["transfers"]
        for k, v in before.items():
            if isinstance(v, (int, float)):
                counters.setdefault(k, []).append(round(after[k] - v, 2))
    return {"step_ms": ms, **{k: v for k, v in counters.items() if any(v)}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--share", type=lambda v: [int(x) for x in v.split(",")], default=[8, 4, 2],
                        help="windows to try, as the fraction of the cap (tiermem.torch.WINDOW_SHARE)")
    parser.add_argument("--models", default="tied,moe")
    parser.add_argument("--settle", type=int, default=0, help="first time each step after offloading, this many steps")
    parser.add_argument("--traces", action="store_true", help="keep the Chrome traces (OUT_DIR/decode-traces.tar)")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"raw_h2d_GBps": tb.raw_h2d_GBps()}
    scratch = Path(tempfile.mkdtemp(prefix="tiermem-timeline-"))
    for name in args.models.split(","):
        model, cap, vocab = {"tied": tied_model, "moe": moe_model}[name]()
        size = tb.nbytes(model)
        gen = torch.Generator("cuda").manual_seed(17)
        prompt = torch.randint(0, vocab, (16, 32), device="cuda", generator=gen)
        pool = tiermem.Pool(hbm_limit=cap)
        handle = tt.offload(model, pool, prefetch_bytes=cap)
        torch.cuda.empty_cache()
        if args.settle:
            results[f"{name}_settling"] = settling(model, pool, prompt, args.settle)
            print(json.dumps({name: results[f"{name}_settling"]}), flush=True)
        for share in args.share:
            tt.WINDOW_SHARE = share
            window = handle.window_bytes
            handle.pool = pool
            tb.decode(model, prompt, 3)
            _, _, plain_s = tb.decode(model, prompt, 6)
            handle.pool = _Named(pool)
            tb.decode(model, prompt, 3)
            before = pool.stats()["transfers"]
            _, _, step_s = tb.decode(model, prompt, 6)
            after = pool.stats()["transfers"]
            per_pass = {k: round((after[k] - v) / 7, 2) for k, v in before.items() if isinstance(v, (int, float))}
            trace = scratch / f"{name}-{window >> 20}MiB.json"
            cache = transformers.DynamicCache()
            with torch.no_grad():
                out = model(input_ids=prompt, past_key_values=cache, use_cache=True)
                token = out.logits[:, -1:].argmax(-1)
                for _ in range(2):
                    out = model(input_ids=token, past_key_values=cache, use_cache=True)
                    token = out.logits[:, -1:].argmax(-1)
                with torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
                ) as prof:
                    for _ in range(2):
                        torch.cuda.synchronize()
                        with torch.profiler.record_function("decode_step"):
                            out = model(input_ids=token, past_key_values=cache, use_cache=True)
                            token = out.logits[:, -1:].argmax(-1)
                            torch.cuda.synchronize()
            prof.export_chrome_trace(str(trace))
            if args.traces:
                with open(trace, "rb") as src, gzip.open(f"{trace}.gz", "wb") as dst:
                    shutil.copyfileobj(src, dst)
            key = f"{name}_{window >> 20}MiB"
            results[key] = {
                "model_bytes": size, "cap_bytes": cap, "window_bytes": handle.window_bytes,
                "decode_tok_s": prompt.shape[0] / step_s, "decode_tok_s_unnamed_calls": prompt.shape[0] / plain_s,
                "pcie_bound_tok_s": prompt.shape[0] / ((size - cap) / (results["raw_h2d_GBps"] * 1e9)),
                "transfers_per_pass": per_pass, **analyse(trace, 2),
            }  # fmt: skip
            handle.pool = pool
            print(json.dumps({key: results[key]}, indent=1), flush=True)
        del model, handle, pool
        torch.cuda.empty_cache()
    (args.out / "decode-timeline.json").write_text(json.dumps(results, indent=1))
    if args.traces:
        with tarfile.open(args.out / "decode-traces.tar", "w") as tar:
            for f in sorted(scratch.glob("*.gz")):
                tar.add(f, arcname=f.name)
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
