#!/usr/bin/env bash
# The twenty-ninth session's open question (issue 16): torch.compile at 0.5x its peak gave other
# losses once, in the matrix's order of runs (plain, 2x, 0.7x, 0.5x on one Inductor cache), and
# not in two repeats. This runs that order twice more with every move checked
# (TIERMEM_VERIFY_MOVES=on: a move whose bytes differ is undone and named on stderr), the
# losses in each run's report. Differing losses with no move named point at the program
# (Inductor's timing-based choices); a move named is a byte tiermem lost.
# Usage (on the GPU machine, after scripts/gpu/build.sh here): scripts/gpu/probes/compile_repeat.sh OUT [PASSES]
set -u
out=$1 passes=${2:-2} limit=${PASS_TIMEOUT:-560}
mkdir -p "$out"
export TIERMEM_VERIFY_MOVES=on TIERMEM_STATS=1
for pass in $(seq "$passes"); do
  rm -rf /tmp/torchinductor_$(id -un)
  timeout "$limit" python3 bench/transparent_matrix.py --tiermem "$PWD/dist/tiermem" --out "$out/matrix-$pass.json" \
    --programs torch_compile 2>&1 | tee -a "$out/log.txt"
  python3 - "$out/matrix-$pass.json" <<'PY' | tee -a "$out/log.txt"
import json, sys
runs = json.load(open(sys.argv[1]))["programs"]["torch_compile"]
plain = (runs["plain"]["report"] or {}).get("losses")
for label, run in runs.items():
    losses = (run["report"] or {}).get("losses")
    checks = [l for l in run.get("tiermem_said", []) if "move check" in l or "moves checked" in l]
    print(label, "same losses" if losses == plain else f"losses {losses}", checks)
PY
done
