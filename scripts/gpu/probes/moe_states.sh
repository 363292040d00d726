#!/usr/bin/env bash
# The twenty-sixth session's second GPU call: moe_states.py with homes handed over and not,
# twice each, alternating; and the engine's look-past schedule test on the GPU, with and without.
# Usage (on the GPU machine, after scripts/gpu/build.sh here): scripts/gpu/probes/moe_states.sh OUT
set -u
out=$1
mkdir -p "$out"; log=$out/log.txt
python3 -m pip install -q --no-index --no-deps dist/wheels/*.whl
export TIERMEM_PEERS=off
mkdir -p /tmp/t && tar -C /tmp/t -xJf dist/tests.tar.xz
for i in 1 2 3; do
  for h in on off; do
    echo "=== look-past schedule test on the GPU, hand over $h, run $i" | tee -a "$log"
    TIERMEM_HAND_OVER=$h TIERMEM_TEST_BACKEND=cuda timeout 60 /tmp/t/tests/engine-schedule paging_ahead_looks_past 2>&1 | grep -E "test result|look_past" | tee -a "$log"
  done
done
for i in 1 2; do
  for h in off on; do
    echo "=== MoE states, hand over $h, run $i" | tee -a "$log"
    TIERMEM_HAND_OVER=$h timeout 120 python3 scripts/gpu/probes/moe_states.py "$out/moe-states-$h-$i.json" 2>&1 | grep -E "^offload|Error|error" | tee -a "$log"
  done
done
