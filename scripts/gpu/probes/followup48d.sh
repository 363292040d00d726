#!/usr/bin/env bash
# The forty-eighth session: activations offloaded beside a resident model (no tt.offload, so no
# recorded schedule: only the loop the engine learns from the acquires, TIERMEM_LEARN_LOOPS), a
# Pool capped at 2 GiB for 9.7 GB of activations a step; the wheel before (dist/wheels-old) and
# after, alternated; and the same with loop learning off.
# Usage (on the GPU machine, dist/ built here): followup48d.sh OUT
set -u
out=$1
export TIERMEM_PEERS=off
install() { python3 -m pip install -q --no-index --no-deps --force-reinstall "$1"/tiermem-*.whl 2>&1 | tail -2; }
show() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('  step_s', round(d['step_s'],3)); [print('  ', p, {k: d['median'][p][k] for k in ('s','bytes_in','bytes_out','evict_wait_ms','stall_ms','map_ms')}) for p in d['median']]" "$1" 2>&1 | tail -4; }
for round in 1 2; do
    for which in old new; do
        install dist/wheels$([ $which = old ] && echo -old)
        timeout 150 python3 scripts/gpu/probes/train_profile.py --steps 7 --activations-only 2048 > "$out/acts-only-$which-$round.json" 2> "$out/acts-only-$which-$round.log"
        echo "$which $round exit $?"; show "$out/acts-only-$which-$round.json"
    done
done
TIERMEM_LEARN_LOOPS=off timeout 150 python3 scripts/gpu/probes/train_profile.py --steps 7 --activations-only 2048 > "$out/acts-only-new-nolearn.json" 2> "$out/acts-only-new-nolearn.log"
echo "new, loops not learned, exit $?"; show "$out/acts-only-new-nolearn.json"
timeout 150 python3 scripts/gpu/probes/train_profile.py --steps 7 --resident > "$out/resident.json" 2> "$out/resident.log"
echo "resident exit $?"; show "$out/resident.json"
echo "=== done ($(date +%T))"
