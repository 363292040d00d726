#!/usr/bin/env bash
# The thirty-seventh session (issue 16): a program whose compute buffers are VMM chunks it maps
# itself beside cudaMalloc'd weights (bench/matrix/vmm_pool.cu, as llama.cpp's CUDA backend),
# in the coverage matrix, with this build (its chunks get HBM, tiermem's weights making room)
# and with the build before (dist/old/: its chunks beyond the budget on the host).
# Results: OUT/matrix-vmm.json, OUT/matrix-vmm-before.json, OUT/vmm-steps.txt.
# Usage (on the GPU machine, after building dist/ here): scripts/gpu/probes/vmm_room.sh OUT
set -u
out=$1
export TIERMEM_PEERS=off
matrix() { timeout 200 python3 bench/transparent_matrix.py --tiermem "$1" --out "$2" --programs vmm_pool --run-args=--stats; }
matrix "$PWD/dist/tiermem" "$out/matrix-vmm.json" 2>&1 | grep "matrix:"
[ -x dist/old/tiermem ] && matrix "$PWD/dist/old/tiermem" "$out/matrix-vmm-before.json" 2>&1 | grep "matrix:"
python3 - "$out" <<'PY' | tee "$out/vmm-steps.txt"
import json, sys
for name in ("matrix-vmm", "matrix-vmm-before"):
    try:
        runs = json.load(open(f"{sys.argv[1]}/{name}.json"))["programs"]["vmm_pool"]
    except (OSError, KeyError):
        continue
    for label, run in runs.items():
        said = [l for l in run.get("tiermem_said", []) if "own VMM" in l or "migration on" in l]
        print(name, label, "step_s_median", (run.get("report") or {}).get("step_s_median"), *said, sep=" | ")
PY
exit 0
