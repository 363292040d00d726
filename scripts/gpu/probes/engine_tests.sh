#!/usr/bin/env bash
# The engine's test binaries (dist/tests.tar.xz, from scripts/gpu/build.sh) on the GPU, one
# output file each in OUT and a summary line each in OUT/log.txt.
# Usage (on the GPU machine): scripts/gpu/probes/engine_tests.sh OUT
set -u
out=$1; log=$out/log.txt
mkdir -p "$out" /tmp/t && tar -C /tmp/t -xJf dist/tests.tar.xz
echo "=== engine tests on the GPU" | tee -a "$log"
for t in /tmp/t/tests/engine-*; do
  TIERMEM_PEERS=off TIERMEM_TEST_BACKEND=cuda timeout 120 "$t" > "$out/$(basename "$t").txt" 2>&1
  echo "$(basename "$t"): $(grep -E "test result" "$out/$(basename "$t").txt" | tail -1)" | tee -a "$log"
done
