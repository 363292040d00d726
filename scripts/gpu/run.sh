#!/usr/bin/env bash
# Runs on the GPU machine: every test binary, the demo and the benchmarks, in one go.
# Usage: scripts/gpu/run.sh DIST OUT COMMIT [PHASES]
#   DIST   folder made by scripts/gpu/build.sh (binaries, test binaries, wheels)
#   OUT    folder for logs and JSON results
#   COMMIT the commit being measured
#   PHASES comma-separated, default all: rust,demo,limits,soak,python,engine,tenants,nvme,torch (torch-small:
#          the torch benchmark's smoke test)
# SOAK_SECONDS (default 300) and SOAK_THREADS (default 8) size the soak; TENANTS_ARGS adds to bench tenants.
set -uo pipefail
dist=$1 out=$2 commit=$3 phases=${4:-rust,demo,limits,soak,python,engine,tenants,nvme,torch}
want() { [[ ",$phases," == *",$1,"* ]]; }
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
if want rust; then
  for t in "$dist"/tests/*; do
    step "tests on the GPU: $(basename "$t")"
    TIERMEM_TEST_BACKEND=cuda run "$t" --test-threads=1 --nocapture
  done
fi
if want python || want torch || want torch-small; then
  step "install the wheel"; run python3 -m pip install -q --no-index --no-deps "$dist"/wheels/*.whl
fi
want python && { step "Python tests on the GPU"; TIERMEM_TEST_BACKEND=cuda run python3 -m pytest -q -rs python/tests; }
want demo && { step "tiermem demo"; run "$dist/tiermem" demo; }
if want limits; then
  step "caps beyond the machine are clear errors, before anything is allocated"
  for setting in TIERMEM_HBM_LIMIT=100TiB TIERMEM_HOST_LIMIT=100TiB "TIERMEM_FILE=$scratch/f TIERMEM_FILE_LIMIT=100TiB"; do
    echo "--- $setting"; env $setting "$dist/tiermem" demo --rounds 1 2>&1 | tail -2 | tee -a "$out/log.txt"
  done
fi
want soak && { step "tiermem soak"; TIERMEM_COMMIT=$commit run "$dist/tiermem" soak --seconds "${SOAK_SECONDS:-300}" --threads "${SOAK_THREADS:-8}" --file "$scratch/soak-file" --json "$out/results"; }
want engine && { step "tiermem bench engine"; TIERMEM_COMMIT=$commit run "$dist/tiermem" bench engine --json "$out/results"; }
want tenants && { step "tiermem bench tenants"; TIERMEM_COMMIT=$commit run "$dist/tiermem" bench tenants --json "$out/results" ${TENANTS_ARGS:-}; }
want nvme && { step "tiermem bench nvme"; df -T "$scratch" | tail -1; TIERMEM_COMMIT=$commit run "$dist/tiermem" bench nvme --json "$out/results" --dir "$scratch" --reps 5; }
want torch-small && { step "torch benchmark (small)"; run python3 bench/torch_bench.py --json "$out/results" --commit "$commit" --small --scratch "$scratch"; }
want torch && { step "torch benchmark"; run python3 bench/torch_bench.py --json "$out/results" --commit "$commit" --scratch "$scratch"; }
step "done: status $status"
exit $status
