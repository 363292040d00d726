#!/usr/bin/env bash
# The planned resident set, second A/B on one GPU: the schedule tests in full, the torch benchmark
# (dense, MoE, tied) and bench tenants with it and with TIERMEM_SPREAD_RESIDENT=off.
# Usage (on the GPU machine, after scripts/gpu/build.sh here): scripts/gpu/probes/spread_ab2.sh OUT COMMIT
set -u
out=$1 commit=$2
mkdir -p "$out/all"; log=$out/all/log.txt
python3 -m pip install -q --no-index --no-deps dist/wheels/tiermem-*.whl
tar -C dist -xJf dist/tests.tar.xz
echo "=== engine-schedule on the GPU" | tee -a "$log"
TIERMEM_TEST_BACKEND=cuda timeout 90 dist/tests/engine-schedule --test-threads=1 > "$out/all/schedule.log" 2>&1
grep -E "panicked|chunks, cap|test result" "$out/all/schedule.log" | tee -a "$log"
for spread in on off; do
  echo "=== torch, spread $spread" | tee -a "$log"
  TIERMEM_SPREAD_RESIDENT=$spread timeout 200 python3 bench/torch_bench.py --json "$out/all" --commit "$commit-spread-$spread" \
    --parts inference,moe,tied --scratch "$PWD" > "$out/all/torch-$spread.log" 2>&1
  grep -E "of the PCIe bound|vs_|identical" "$out/all/torch-$spread.log" | tail -24 | tee -a "$log"
  echo "=== bench tenants, spread $spread" | tee -a "$log"
  [ $spread = off ] && more=--throughput-only
  TIERMEM_SPREAD_RESIDENT=$spread TIERMEM_COMMIT=$commit-spread-$spread timeout 120 dist/tiermem bench tenants --json "$out/all" ${more:-} 2>&1 | tail -14 | tee -a "$log"
done
for f in "$out"/all/*.json; do case $f in *detail*) ;; *) cp "$f" "$out/" ;; esac; done
tar -C "$out" -cJf "$out/all.tar.xz" all
