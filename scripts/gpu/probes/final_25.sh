#!/usr/bin/env bash
# The twenty-fifth session's last call: the Python tests on the GPU, the torch benchmark
# whole, bench engine and bench tenants whole, at one commit.
# Usage (on the GPU machine, after scripts/gpu/build.sh here): scripts/gpu/probes/final_25.sh OUT COMMIT
set -u
out=$1 commit=$2
mkdir -p "$out"; log=$out/log.txt
python3 -m pip install -q --no-index --no-deps dist/wheels/*.whl
export TIERMEM_PEERS=off
echo "=== Python tests on the GPU" | tee -a "$log"
TIERMEM_TEST_BACKEND=cuda timeout 150 python3 -m pytest -q -rs python/tests > "$out/pytest.txt" 2>&1
tail -2 "$out/pytest.txt" | tee -a "$log"
echo "=== torch benchmark" | tee -a "$log"
timeout 200 python3 bench/torch_bench.py --json "$out" --commit "$commit" --scratch "$PWD" > "$out/torch.log" 2>&1
grep -E "of the PCIe bound|accelerate|wake:|^load|serving" "$out/torch.log" | tail -8 | tee -a "$log"
echo "=== bench engine" | tee -a "$log"
TIERMEM_COMMIT=$commit timeout 80 dist/tiermem bench engine --json "$out" 2>&1 | grep -E "page-in|exchange|advance|verified" | tee -a "$log"
echo "=== bench tenants" | tee -a "$log"
TIERMEM_COMMIT=$commit timeout 200 dist/tiermem bench tenants --json "$out" > "$out/tenants.log" 2>&1
grep -E "GB/s|vs_|hog|fair|overhead|pairs|leak" "$out/tenants.log" | tail -14 | tee -a "$log"
tar -C "$out" -cJf "$out/../final-25.tar.xz" .
