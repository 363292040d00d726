#!/usr/bin/env bash
# The forty-eighth session, second call: tiermem.torch's training tests with the tiny models'
# activations offloaded (they were all under min_bytes before), the training profile at three
# windows and with activations left to PyTorch, and the torch benchmark with the wheel before
# (dist/wheels-old) and after, to see whether the 12-layer MoE's 0.75 of the first call is the
# machine's.
# Usage (on the GPU machine, dist/ built here): followup48b.sh OUT COMMIT
set -u
out=$1 commit=$2
mkdir -p "$out/results" "$out/old"
export TIERMEM_PEERS=off
install() { python3 -m pip install -q --no-index --no-deps --force-reinstall "$1"/tiermem-*.whl 2>&1 | tail -2; }
install dist/wheels
echo "=== tiermem.torch's training tests ($(date +%T))"
TIERMEM_TEST_BACKEND=cuda timeout 150 python3 -m pytest -q -s python/tests/test_torch.py -k "training or activation" -p no:cacheprovider > "$out/pytest.log" 2>&1
echo "exit $?"; grep -E "passed|failed|losses" "$out/pytest.log" | tail -8
echo "=== training profile ($(date +%T))"
for variant in "--prefetch-mib 128" "--prefetch-mib 256" "--prefetch-mib 1024" "--no-activations"; do
    name=$(echo "$variant" | tr -d ' -')
    timeout 150 python3 scripts/gpu/probes/train_profile.py --steps 7 $variant > "$out/profile-$name.json" 2> "$out/profile-$name.log"
    echo "$variant exit $?"
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('  step_s', round(d['step_s'],3)); [print('  ', p, {k: d['median'][p][k] for k in ('s','bytes_in','bytes_out','evict_wait_ms','stall_ms')}) for p in d['median']]" "$out/profile-$name.json" 2>&1 | tail -4
done
mkdir -p gpu-scratch
for which in old new; do
    install dist/wheels$([ $which = old ] && echo -old)
    dir=$out/results; [ $which = old ] && dir=$out/old
    echo "=== torch benchmark, $which ($(date +%T))"
    timeout 200 python3 bench/torch_bench.py --json "$dir" --commit "$commit" --scratch "$PWD/gpu-scratch" > "$out/torch-$which.log" 2>&1
    echo "exit $?"; grep -E "training:|PCIe bound|train_losses_match|moe_12_layer_identical" "$out/torch-$which.log" | tail -8
done
echo "=== done ($(date +%T))"
