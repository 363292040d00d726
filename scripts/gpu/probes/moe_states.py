"""Why the benchmark's MoE decode runs at 0.87 of the PCIe bound in one process and 0.66 in
the next on the same machine, with the same bytes moved (issue 15). In one process: the raw
pinned H2D speed right before and after each of several timed decodes (is the link itself
slower then?), each decode step's time, the engine's host waits; then the model offloaded
afresh (a new schedule and resident plan) and the same again. A probe, not a benchmark.

Usage: python scripts/gpu/probes/moe_states.py OUT_JSON [--offloads 2] [--reps 4]
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import torch_bench as tb  # noqa: E402
import torch_moe  # noqa: E402

import tiermem  # noqa: E402
import tiermem.torch as tt  # noqa: E402


def step_times(model, prompt, steps):
    return tb.decode_steps(model, prompt, steps)[2]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--offloads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=4)
    args = parser.parse_args()
    model, cap, config = torch_moe.mixtral(False)
    size = tb.nbytes(model)
    gen = torch.Generator("cuda").manual_seed(23)
    prompt = torch.randint(0, config.vocab_size, (16, 32), device="cuda", generator=gen)
    step_times(model, prompt, 8)
    plain = statistics.median(step_times(model, prompt, 8))
    pool = tiermem.Pool(hbm_limit=cap)
    records = {"plain_step_s": plain, "size": size, "cap": cap, "offloads": []}
    for o in range(args.offloads):
        handle = tt.offload(model, pool, prefetch_bytes=256 << 20)
        torch.cuda.empty_cache()
        step_times(model, prompt, 8)
        step_times(model, prompt, 8)
        reps = []
        for r in range(args.reps):
            before = tb.raw_h2d_GBps(size=512 << 20, reps=3)
            t0 = pool.stats()["transfers"]
            times = step_times(model, prompt, 8)
            t1 = pool.stats()["transfers"]
            after = tb.raw_h2d_GBps(size=512 << 20, reps=3)
            moved = (t1["bytes_in"] - t0["bytes_in"]) / 9
            link_s = moved / (min(before, after) * 1e9)
            rec = {"h2d_before": before, "h2d_after": after, "steps_s": times, "median_s": statistics.median(times),
                   "moved_per_pass": moved, "link_s_per_pass": link_s,
                   "evict_wait_ms_per_pass": (t1["evict_wait_ms"] - t0["evict_wait_ms"]) / 9,
                   "handed_over": t1.get("handed_over", 0) - t0.get("handed_over", 0)}
            reps.append(rec)
            bound = 16 / ((size - cap) / (before * 1e9))
            print(f"offload {o} rep {r}: h2d {before:.1f}/{after:.1f} GB/s, step median {rec['median_s']*1e3:.1f} ms "
                  f"(min {min(times)*1e3:.1f}, max {max(times)*1e3:.1f}), link {link_s*1e3:.1f} ms, "
                  f"= {16 / rec['median_s'] / bound:.2f} of the bound, evict wait {rec['evict_wait_ms_per_pass']:.1f} ms/pass, "
                  f"handed over {rec['handed_over']}", flush=True)
        records["offloads"].append(reps)
        handle.remove("cuda")
    args.out.write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
