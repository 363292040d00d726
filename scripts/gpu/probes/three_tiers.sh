#!/usr/bin/env bash
# A transparent program over three tiers at once (issue 16): the training loop of `bench
# transparent` (17.5 GB at its peak) with 6 GiB of HBM and 4 GiB of a neighbour's (GPU 1,
# TIERMEM_PEER_LIMIT) and the rest on the host — what the node daemon gave it on the pair while
# a newcomer ran (followup41b: steps of 2.7-9.9 s, ~240 GiB moved a step) — against the same
# HBM host-only, 10 GiB host-only (as fast a capacity), and 6 GiB with the neighbour unbounded.
# One line a run: median step, moved bytes, the moves' phases. Results under OUT.
# Usage (on the GPU machine, two GPUs, after building dist/ here): three_tiers.sh OUT [STEPS]
set -u
out=$1; steps=${2:-10}
mkdir -p "$out"
run() {  # label, then the environment and tiermem run options
  local label=$1; shift
  env "$@" timeout 150 ./dist/tiermem run --stats ${RUN_ARGS:-} -- python3 bench/transparent_train.py --steps "$steps" \
    --out "$out/$label.json" 2> "$out/$label.log"
  echo "$label: exit $? $(python3 -c "import json,sys; d=json.load(open('$out/$label.json')); print('median', d.get('step_s_median'), 'steps', [round(s,2) for s in d.get('step_s', [])])" 2>/dev/null)"
  grep "migration on\|moves:\|segments on\|neighbours" "$out/$label.log" | cut -c16-260
}
RUN_ARGS="--hbm-limit 10GiB" run host10 TIERMEM_PEERS=off
RUN_ARGS="--hbm-limit 6GiB" run host6 TIERMEM_PEERS=off
RUN_ARGS="--hbm-limit 6GiB" run peer4 TIERMEM_PEERS=1 TIERMEM_PEER_LIMIT=4GiB
RUN_ARGS="--hbm-limit 6GiB" run peer_all TIERMEM_PEERS=1
exit 0
