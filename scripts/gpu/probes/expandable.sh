#!/usr/bin/env bash
# The thirty-seventh session (issue 16): PyTorch with `expandable_segments:True` under
# `tiermem run`. The benchmark's training loop (bench/transparent_train.py) plainly, with and
# without expandable segments, then at 0.7x and 0.5x its peak with them asked for: with
# --keep-allocators (PyTorch maps its own chunks, which tiermem does not move) and by default
# (tiermem run turns them off). Results: OUT/*.json (one per run), OUT/*.err, OUT/summary.json.
# Usage (on the GPU machine, after building dist/ here): scripts/gpu/probes/expandable.sh OUT
set -u
out=$1 tiermem=$PWD/dist/tiermem train=bench/transparent_train.py
export TIERMEM_PEERS=off
es=expandable_segments:True
train() { local name=$1; shift; timeout 170 "$@" python3 $train --out "$out/$name.json" --steps 8 2> "$out/$name.err"; }
train plain env PYTORCH_CUDA_ALLOC_CONF=
train plain-es env PYTORCH_CUDA_ALLOC_CONF=$es
peak=$(python3 -c "import json; print(json.load(open('$out/plain.json'))['max_memory_reserved'])")
for share in 7 5; do
    budget=$((peak * share / 10))
    train es-kept-0_$share env PYTORCH_CUDA_ALLOC_CONF=$es "$tiermem" run --hbm-limit $budget --stats --keep-allocators --
    train es-off-0_$share env PYTORCH_CUDA_ALLOC_CONF=$es "$tiermem" run --hbm-limit $budget --stats --
done
python3 - "$out" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
runs = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json")) if p.stem != "summary"}
plain = runs.get("plain", {})
summary = {name: {"step_s_median": r.get("step_s_median"), "losses_identical": r.get("losses") == plain.get("losses"),
                  "oom": r.get("oom"), "speed": (plain.get("step_s_median") or 0) / (r.get("step_s_median") or float("inf"))}
           for name, r in runs.items()}
summary["peak_bytes"] = plain.get("max_memory_reserved")
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary, indent=2))
PY
grep -h "tiermem:" "$out"/*.err | grep -v "^$" | head -30
exit 0
