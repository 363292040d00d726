#!/usr/bin/env bash
# The twenty-seventh session's engine GPU tests and bench engine at one commit, then bench
# tenants with pinning room ahead on (the default) and off, alternating.
# Usage (on the GPU machine, after scripts/gpu/build.sh here): scripts/gpu/probes/final_27.sh OUT COMMIT [RUNS]
set -u
out=$1 commit=$2 runs=${3:-2}
mkdir -p "$out"; log=$out/log.txt
export TIERMEM_PEERS=off
scripts/gpu/probes/engine_tests.sh "$out"
grep -h -E "^test .* FAILED|panicked" "$out"/engine-*.txt | head -10 | tee -a "$log"
echo "=== bench engine" | tee -a "$log"
TIERMEM_COMMIT=$commit timeout 90 dist/tiermem bench engine --json "$out" 2>&1 | grep -E "page-in|exchange|advance|loop|verified" | tee -a "$log"
scripts/gpu/probes/evict_room_ab.sh "$out/ab" "$commit" "$runs"
tar -C "$out" -cJf "$out/../final-27.tar.xz" .
