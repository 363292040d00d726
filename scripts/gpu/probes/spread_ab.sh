#!/usr/bin/env bash
# The planned resident set (schedule.rs), A/B on one GPU: its engine tests, bench engine, the torch
# benchmark (tied and MoE windows swept) with it and with TIERMEM_SPREAD_RESIDENT=off, bench tenants if TENANTS is set.
# Usage (on the GPU machine, after scripts/gpu/build.sh here): scripts/gpu/probes/spread_ab.sh OUT COMMIT [PARTS]
set -u
out=$1 commit=$2 parts=${3:-inference,moe,tied}
mkdir -p "$out/all"; log=$out/all/log.txt
python3 -m pip install -q --no-index --no-deps dist/wheels/tiermem-*.whl
tar -C dist -xJf dist/tests.tar.xz
for t in schedule spread_resident; do
  echo "=== engine-$t on the GPU" | tee -a "$log"
  TIERMEM_TEST_BACKEND=cuda timeout 90 dist/tests/engine-$t --test-threads=1 2>&1 | tail -4 | tee -a "$log"
done
echo "=== bench engine" | tee -a "$log"
TIERMEM_COMMIT=$commit dist/tiermem bench engine --json "$out/all" 2>&1 | tail -3 | tee -a "$log"
for spread in on off; do
  echo "=== torch, spread $spread" | tee -a "$log"
  [ $spread = off ] && parts=moe,tied
  TIERMEM_SPREAD_RESIDENT=$spread timeout 220 python3 bench/torch_bench.py --json "$out/all" --commit "$commit-spread-$spread" \
    --parts "$parts" --sweep 32,64,128 --scratch "$PWD" > "$out/all/torch-$spread.log" 2>&1
  grep -E "of the PCIe bound|window|vs_|identical" "$out/all/torch-$spread.log" | tail -30 | tee -a "$log"
done
if [ -n "${TENANTS:-}" ]; then
  echo "=== bench tenants" | tee -a "$log"
  TIERMEM_COMMIT=$commit timeout 150 dist/tiermem bench tenants --json "$out/all" 2>&1 | tail -12 | tee -a "$log"
fi
cp "$out"/all/*.json "$out/" 2>/dev/null
tar -C "$out" -cJf "$out/all.tar.xz" all
