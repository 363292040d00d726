#!/usr/bin/env bash
# The twenty-sixth session's bench engine, bench tenants and the engine's GPU tests, at one commit.
# Usage (on the GPU machine, after scripts/gpu/build.sh here): scripts/gpu/probes/final_26b.sh OUT COMMIT
set -u
out=$1 commit=$2
mkdir -p "$out"; log=$out/log.txt
export TIERMEM_PEERS=off
scripts/gpu/probes/engine_tests.sh "$out"
echo "=== bench engine" | tee -a "$log"
TIERMEM_COMMIT=$commit timeout 90 dist/tiermem bench engine --json "$out" 2>&1 | grep -E "page-in|exchange|advance|loop|verified" | tee -a "$log"
echo "=== bench tenants" | tee -a "$log"
TIERMEM_COMMIT=$commit timeout 220 dist/tiermem bench tenants --json "$out" > "$out/tenants.log" 2>&1
grep -E "GB/s|vs_|hog|fair|overhead|pairs|leak" "$out/tenants.log" | tail -14 | tee -a "$log"
echo "=== where a tied decode step's time goes (torch.profiler)" | tee -a "$log"
python3 -m pip install -q --no-index --no-deps dist/wheels/*.whl
timeout 120 python3 scripts/gpu/probes/decode_timeline.py "$out/timeline" --models tied > "$out/timeline.txt" 2>&1
tail -12 "$out/timeline.txt" | tee -a "$log"
tar -C "$out" -cJf "$out/../final-26b.tar.xz" .
