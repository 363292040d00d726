#!/usr/bin/env bash
# The thirty-seventh session (issue 16): the benchmark's training loop on PyTorch's
# cudaMallocAsync backend, plainly and under `tiermem run` at 0.7x its peak (12 steps, the
# steady step: the median of the last quarter, as `bench transparent` counts it), after
# pool_stats.rs added bookkeeping to every stream-ordered allocation and free.
# Results: OUT/async-plain.json, OUT/async-0_7.json, OUT/async-0_7.err.
# Usage (on the GPU machine, after building dist/ here): scripts/gpu/probes/async_steady.sh OUT
set -u
out=$1 train=bench/transparent_train.py
export TIERMEM_PEERS=off PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
python3 $train --out "$out/async-plain.json" --steps 12 2> "$out/async-plain.err"
peak=17504927744  # the loop's peak on the H200 with PyTorch's default allocator (the benchmark's budgets)
dist/tiermem run --hbm-limit $((peak * 7 / 10)) --stats -- python3 $train --out "$out/async-0_7.json" --steps 12 2> "$out/async-0_7.err"
python3 - "$out" <<'PY'
import json, sys, statistics
runs = {n: json.load(open(f"{sys.argv[1]}/async-{n}.json")) for n in ("plain", "0_7")}
for n, r in runs.items():
    steps = r["step_s"]
    print(n, "steady", round(statistics.median(steps[-len(steps) // 4:]), 3), "all", [round(x, 3) for x in steps],
          "losses identical", r["losses"] == runs["plain"]["losses"], "allocated peak", r.get("max_memory_allocated"))
PY
grep "tiermem: stats" "$out/async-0_7.err" | head -4
exit 0
