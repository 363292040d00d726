#!/usr/bin/env bash
# The forty-seventh session's last GPU call, at the revert of page_ahead: bench engine, the
# torch benchmark and the training profile (train_profile.py) as main has them.
# Usage (on the GPU machine, dist/ built here): followup47f.sh OUT COMMIT
set -u
out=$1 commit=$2
mkdir -p "$out/results"
export TIERMEM_PEERS=off
python3 -m pip install -q --no-index --no-deps dist/wheels/tiermem-*.whl 2>&1 | tail -2
echo "=== bench engine ($(date +%T))"
TIERMEM_COMMIT=$commit timeout 120 dist/tiermem bench engine --json "$out/results" 2>&1 | tail -8
echo "=== torch benchmark ($(date +%T))"
mkdir -p gpu-scratch
timeout 200 python3 bench/torch_bench.py --json "$out/results" --commit "$commit" --scratch "$PWD/gpu-scratch" > "$out/torch.log" 2>&1
echo "exit $?"; grep -E "training:|PCIe bound|_identical|train_losses|accelerate" "$out/torch.log" | tail -24
echo "=== training profile ($(date +%T))"
timeout 150 python3 scripts/gpu/probes/train_profile.py --steps 5 > "$out/train-profile.json" 2> "$out/train-profile.log"
echo "exit $?"
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('step_s', d['step_s']); [print(p, d['median'][p]) for p in d['median']]" "$out/train-profile.json" 2>&1 | tail -4
echo "=== done ($(date +%T))"
