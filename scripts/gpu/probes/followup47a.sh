#!/usr/bin/env bash
# The forty-seventh session's first GPU call: where an offloaded training step's time goes
# (train_profile.py: forward, backward and the optimizer's step, each with the engine's
# counters), by default and with each knob that could change it.
# Usage (on the GPU machine, dist/ built here): followup47a.sh OUT
set -u
out=$1
mkdir -p "$out"
export TIERMEM_PEERS=off
nvidia-smi -L
python3 -m pip install -q --no-index --no-deps dist/wheels/tiermem-*.whl 2>&1 | tail -2
probe=scripts/gpu/probes/train_profile.py
run() {  # NAME ENV… -- ARGS…
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  echo "=== $name ($(date +%T))"
  env "${envs[@]}" timeout 150 python3 "$probe" "$@" > "$out/$name.json" 2> "$out/$name.log"
  echo "exit $?"; tail -7 "$out/$name.log"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('step_s', d['step_s']); [print(p, d['median'][p]) for p in d['median']]" "$out/$name.json" 2>&1 | tail -4
}
run resident X=1 -- --resident --steps 4
run default X=1 -- --steps 5
run ahead-waits TIERMEM_AHEAD_WAITS=on -- --steps 5
run prefetch-1g X=1 -- --steps 5 --prefetch-mib 1024
run no-activations X=1 -- --steps 5 --no-activations
echo "=== done ($(date +%T))"
exit 0
