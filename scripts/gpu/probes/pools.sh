#!/usr/bin/env bash
# The thirty-seventh session (issue 16): a program that allocates from a memory pool it created
# (bench/matrix/created_pool.cu, as RAPIDS' async resource does) in the coverage matrix, plainly
# and at 2x, 0.7x, 0.5x its peak, with this build and with the build before created pools were
# served (dist/old/, if there). `--stats` says whose the memory was. Results:
# OUT/matrix-pool.json, OUT/matrix-pool-before.json, logs.
# Usage (on the GPU machine, after building dist/ here): scripts/gpu/probes/pools.sh OUT
set -u
out=$1
export TIERMEM_PEERS=off
matrix() { timeout 250 python3 bench/transparent_matrix.py --tiermem "$1" --out "$2" --programs "$3" --run-args=--stats; }
matrix "$PWD/dist/tiermem" "$out/matrix-pool.json" created_pool,cupy 2>&1 | tee "$out/matrix-pool.log"
if [ -x dist/old/tiermem ]; then
    matrix "$PWD/dist/old/tiermem" "$out/matrix-pool-before.json" created_pool 2>&1 | tee "$out/matrix-pool-before.log"
fi
python3 - "$out" <<'PY'
import json, sys
for name in ("matrix-pool", "matrix-pool-before"):
    try:
        r = json.load(open(f"{sys.argv[1]}/{name}.json"))
    except OSError:
        continue
    for label, run in r["programs"].get("created_pool", {}).items():
        said = [l for l in run.get("tiermem_said", []) if "allocations (" in l or "HBM " in l or "migration on" in l]
        print(name, label, run["exit"], run["seconds"], *said, sep="\n  ")
PY
exit 0
