#!/usr/bin/env bash
# Runs on the GPU machine: the GPU tests and the engine benchmark, in one go.
# Usage: scripts/gpu/run.sh DIST OUT COMMIT
#   DIST   folder made by scripts/gpu/build.sh (the tiermem binary and test binaries)
#   OUT    folder for logs and JSON results
#   COMMIT the commit being measured
set -uo pipefail
dist=$1 out=$2 commit=$3
mkdir -p "$out/results"
status=0
step() { echo; echo "=== $*"; }
run() { "$@" 2>&1 | tee -a "$out/log.txt"; local rc=${PIPESTATUS[0]}; [ "$rc" -eq 0 ] || { echo "FAILED ($rc): $*"; status=1; }; }

step "GPU"; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1 | tee -a "$out/log.txt"
step "tiermem info"; run "$dist/tiermem" info
step "CUDA backend tests"; run "$dist/tests/mechanism" --test-threads=1 --nocapture
for t in "$dist"/tests/engine-*; do
  step "engine tests on the GPU: $(basename "$t")"
  TIERMEM_TEST_BACKEND=cuda run "$t" --test-threads=1
done
step "tiermem demo"; run "$dist/tiermem" demo
step "tiermem bench engine"; TIERMEM_COMMIT=$commit run "$dist/tiermem" bench engine --json "$out/results"
step "done: status $status"
exit $status
