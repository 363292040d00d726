#!/usr/bin/env bash
# The forty-seventh session's fourth GPU call: offloaded training after what page_ahead
# brings in is kept until used (train_profile.py at three prefetch depths, and backward's
# prefetch into free HBM only, as before page_ahead, on the same machine), then bench engine
# and the torch benchmark. Usage (on the GPU machine, dist/ built here): followup47d.sh OUT COMMIT
set -u
out=$1 commit=$2
mkdir -p "$out/results"
export TIERMEM_PEERS=off
python3 -m pip install -q --no-index --no-deps dist/wheels/tiermem-*.whl 2>&1 | tail -2
profile() {  # NAME ARGS…
  local name=$1; shift
  echo "=== $name ($(date +%T))"
  timeout 150 python3 scripts/gpu/probes/train_profile.py --steps 5 "$@" > "$out/$name.json" 2> "$out/$name.log"
  echo "exit $?"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('step_s', d['step_s']); [print(p, d['median'][p]) for p in d['median']]" "$out/$name.json" 2>&1 | tail -4
}
profile plain-2 --act-prefetch 2 --plain-prefetch
profile evict-2 --act-prefetch 2
profile evict-8 --act-prefetch 8
profile evict-32 --act-prefetch 32
profile plain-2-again --act-prefetch 2 --plain-prefetch
echo "=== bench engine ($(date +%T))"
TIERMEM_COMMIT=$commit timeout 120 dist/tiermem bench engine --json "$out/results" 2>&1 | tail -6
echo "=== torch benchmark ($(date +%T))"
mkdir -p gpu-scratch
timeout 200 python3 bench/torch_bench.py --json "$out/results" --commit "$commit" --scratch "$PWD/gpu-scratch" > "$out/torch.log" 2>&1
echo "exit $?"; grep -E "training:|vs_pcie_bound|_identical|train_losses" "$out/torch.log" | tail -20
echo "=== done ($(date +%T))"
