#!/usr/bin/env bash
# The forty-seventh session's third GPU call: offloaded training after backward's activation
# prefetch may evict (Pool.prefetch(evict=True), Engine::page_ahead): train_profile.py at
# three prefetch depths, then bench engine and the torch benchmark (the engine's targets).
# Usage (on the GPU machine, dist/ built here): followup47c.sh OUT COMMIT
set -u
out=$1 commit=$2
mkdir -p "$out/results"
export TIERMEM_PEERS=off
python3 -m pip install -q --no-index --no-deps dist/wheels/tiermem-*.whl 2>&1 | tail -2
for n in 2 8 32; do
  echo "=== act-prefetch $n ($(date +%T))"
  timeout 150 python3 scripts/gpu/probes/train_profile.py --steps 5 --act-prefetch $n > "$out/act-prefetch-$n.json" 2> "$out/act-prefetch-$n.log"
  echo "exit $?"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('step_s', d['step_s']); [print(p, d['median'][p]) for p in d['median']]" "$out/act-prefetch-$n.json" 2>&1 | tail -4
done
echo "=== bench engine ($(date +%T))"
TIERMEM_COMMIT=$commit timeout 120 dist/tiermem bench engine --json "$out/results" 2>&1 | tail -14
echo "=== torch benchmark ($(date +%T))"
mkdir -p gpu-scratch
timeout 200 python3 bench/torch_bench.py --json "$out/results" --commit "$commit" --scratch "$PWD/gpu-scratch" > "$out/torch.log" 2>&1
echo "exit $?"; tail -25 "$out/torch.log"
echo "=== done ($(date +%T))"
