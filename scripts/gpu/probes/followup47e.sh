#!/usr/bin/env bash
# The forty-seventh session's fifth GPU call: followup47d.sh's profiles again (its page_ahead
# runs failed on the probe's own import), alternating backward's prefetch into free HBM only
# and page_ahead. Usage (on the GPU machine, dist/ built here): followup47e.sh OUT
set -u
out=$1
mkdir -p "$out"
export TIERMEM_PEERS=off
python3 -m pip install -q --no-index --no-deps dist/wheels/tiermem-*.whl 2>&1 | tail -2
profile() {  # NAME ARGS…
  local name=$1; shift
  echo "=== $name ($(date +%T))"
  timeout 150 python3 scripts/gpu/probes/train_profile.py --steps 5 "$@" > "$out/$name.json" 2> "$out/$name.log"
  echo "exit $?"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('step_s', d['step_s']); [print(p, d['median'][p]) for p in d['median']]" "$out/$name.json" 2>&1 | tail -4
}
profile evict-2 --act-prefetch 2
profile plain-2 --act-prefetch 2 --plain-prefetch
profile evict-8 --act-prefetch 8
profile evict-2-again --act-prefetch 2
profile plain-2-again --act-prefetch 2 --plain-prefetch
echo "=== done ($(date +%T))"
