#!/usr/bin/env bash
# Runs on the GPU machine: every test binary, the demo and the benchmarks, in one go.
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
# Files of the file tier's tests and benchmark go on the machine's disk (O_DIRECT).
scratch=$PWD/gpu-scratch
mkdir -p "$scratch"
export TIERMEM_TEST_FILE_DIR=$scratch TIERMEM_FS_TEST_DIR=$scratch
for t in "$dist"/tests/*; do
  step "tests on the GPU: $(basename "$t")"
  TIERMEM_TEST_BACKEND=cuda run "$t" --test-threads=1 --nocapture
done
step "tiermem demo"; run "$dist/tiermem" demo
step "tiermem bench engine"; TIERMEM_COMMIT=$commit run "$dist/tiermem" bench engine --json "$out/results"
step "tiermem bench nvme"; df -T "$scratch" | tail -1; TIERMEM_COMMIT=$commit run "$dist/tiermem" bench nvme --json "$out/results" --dir "$scratch"
step "done: status $status"
exit $status
