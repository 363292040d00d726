#!/usr/bin/env bash
# The thirty-seventh session (issue 16): a training loop that synchronizes only every K steps
# (as one that logs every K steps), plainly and under `tiermem run` at 0.7x its peak, for
# K = 1, 4, 12: stage 3 pages within a cycle, and a cycle is then K steps long.
# Results: OUT/summary.json (+ OUT/*.json per run, OUT/*.err).
# Usage (on the GPU machine, after building dist/ here): scripts/gpu/probes/sync_every.sh OUT [STEPS]
set -u
out=$1 steps=${2:-24} tiermem=$PWD/dist/tiermem train=bench/transparent_train.py
export TIERMEM_PEERS=off
train() { local name=$1 k=$2; shift 2; timeout 150 "$@" python3 $train --out "$out/$name.json" --steps "$steps" --sync-every "$k" 2> "$out/$name.err"; }
train plain-1 1 env
peak=$(python3 -c "import json; print(json.load(open('$out/plain-1.json'))['max_memory_reserved'])")
budget=$((peak * 7 / 10))
for k in 1 4 12; do
    [ "$k" != 1 ] && train plain-$k $k env
    train capped-$k $k "$tiermem" run --hbm-limit $budget --stats --
done
python3 - "$out" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
runs = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json")) if p.stem != "summary"}
base = runs["plain-1"]["losses"]
summary = {}
for k in (1, 4, 12):
    plain, capped = runs.get(f"plain-{k}", {}), runs.get(f"capped-{k}", {})
    summary[f"k{k}"] = {"plain_step_s": plain.get("step_s_median"), "capped_step_s": capped.get("step_s_median"),
                        "speed": (plain.get("step_s_median") or 0) / (capped.get("step_s_median") or float("inf")),
                        "losses_identical": capped.get("losses") == base and plain.get("losses") == base}
    err = out / f"capped-{k}.err"
    summary[f"k{k}"]["stats"] = [l for l in err.read_text().splitlines() if "migration on" in l or "segments on" in l] if err.exists() else []
summary["peak_bytes"] = runs["plain-1"].get("max_memory_reserved")
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary, indent=2))
PY
exit 0
