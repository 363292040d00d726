#!/usr/bin/env bash
# The twenty-sixth session's full torch benchmark (MoE headline: the Mixtral-depth model, the
# 12-layer one beside it) and the Python tests on the GPU, at one commit.
# Usage (on the GPU machine, after scripts/gpu/build.sh here): scripts/gpu/probes/final_26a.sh OUT COMMIT
set -u
out=$1 commit=$2
mkdir -p "$out"; log=$out/log.txt
python3 -m pip install -q --no-index --no-deps dist/wheels/*.whl
export TIERMEM_PEERS=off
echo "=== torch benchmark" | tee -a "$log"
timeout 300 python3 bench/torch_bench.py --json "$out" --commit "$commit" --scratch "$PWD" > "$out/torch.log" 2>&1
grep -E "of the PCIe bound|accelerate|wake:|^load|serving|verified" "$out/torch.log" | tail -12 | tee -a "$log"
echo "=== Python tests on the GPU" | tee -a "$log"
python3 -m pip install -q --no-index --find-links dist/wheels pytest 2>/dev/null
TIERMEM_TEST_BACKEND=cuda timeout 200 python3 -m pytest -q -rs python/tests > "$out/pytest.txt" 2>&1
tail -3 "$out/pytest.txt" | tee -a "$log"
xz -k "$out/torch.log"
