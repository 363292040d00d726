#!/usr/bin/env bash
# The forty-seventh session's second GPU call: offload_activations' prefetch depth in an
# offloaded training step (train_profile.py). Usage: followup47b.sh OUT
set -u
out=$1
mkdir -p "$out"
export TIERMEM_PEERS=off
python3 -m pip install -q --no-index --no-deps dist/wheels/tiermem-*.whl 2>&1 | tail -2
for n in 2 8 32 128; do
  echo "=== act-prefetch $n ($(date +%T))"
  timeout 150 python3 scripts/gpu/probes/train_profile.py --steps 5 --act-prefetch $n > "$out/act-prefetch-$n.json" 2> "$out/act-prefetch-$n.log"
  echo "exit $?"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('step_s', d['step_s']); [print(p, d['median'][p]) for p in d['median']]" "$out/act-prefetch-$n.json" 2>&1 | tail -4
done
echo "=== done ($(date +%T))"
