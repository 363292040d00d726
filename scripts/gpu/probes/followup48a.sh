#!/usr/bin/env bash
# The forty-eighth session: activations in the schedule (offload_activations reusing each
# place's buffer, its bytes discarded; Pool.discard, Pool.step_also_uses). The engine's new
# tests on the GPU, tiermem.torch's training tests, the training profile alternated between
# the wheel before (dist/wheels-old) and after, then bench engine and the torch benchmark.
# Usage (on the GPU machine, dist/ built here): followup48a.sh OUT COMMIT
set -u
out=$1 commit=$2
mkdir -p "$out/results"
export TIERMEM_PEERS=off
install() { python3 -m pip install -q --no-index --no-deps --force-reinstall "$1"/tiermem-*.whl 2>&1 | tail -2; }
echo "=== engine tests on the GPU ($(date +%T))"
for t in discard schedule_recorded; do
    TIERMEM_TEST_BACKEND=cuda timeout 120 dist/tests/$t -q 2>&1 | tail -3
done
install dist/wheels
echo "=== tiermem.torch's training tests ($(date +%T))"
TIERMEM_TEST_BACKEND=cuda timeout 150 python3 -m pytest -q -s python/tests/test_torch.py -k "training or activation" -p no:cacheprovider > "$out/pytest.log" 2>&1
echo "exit $?"; grep -E "passed|failed|losses" "$out/pytest.log" | tail -8
echo "=== training profile, before and after, alternated ($(date +%T))"
for round in 1 2; do
    for which in old new; do
        install dist/wheels$([ $which = old ] && echo -old)
        timeout 150 python3 scripts/gpu/probes/train_profile.py --steps 7 > "$out/profile-$which-$round.json" 2> "$out/profile-$which-$round.log"
        echo "$which $round exit $?"
        python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('  step_s', round(d['step_s'],3)); [print('  ', p, d['median'][p]) for p in d['median']]" "$out/profile-$which-$round.json" 2>&1 | tail -4
    done
done
install dist/wheels
echo "=== bench engine ($(date +%T))"
TIERMEM_COMMIT=$commit timeout 120 dist/tiermem bench engine --json "$out/results" 2>&1 | tail -6
echo "=== torch benchmark ($(date +%T))"
mkdir -p gpu-scratch
timeout 200 python3 bench/torch_bench.py --json "$out/results" --commit "$commit" --scratch "$PWD/gpu-scratch" > "$out/torch.log" 2>&1
echo "exit $?"; grep -E "training:|PCIe bound|_identical|train_losses" "$out/torch.log" | tail -20
echo "=== done ($(date +%T))"
