#!/usr/bin/env bash
# The twenty-sixth session's last GPU call: bench tenants' throughput set with the tiermem
# program built at 2a1e25f (dist/old/tiermem) and at the last commit (dist/tiermem),
# alternating, three times each: machine or code?
# Usage (on the GPU machine): scripts/gpu/probes/tenants_ab.sh OUT
set -u
out=$1
mkdir -p "$out"; log=$out/log.txt
export TIERMEM_PEERS=off
for i in 1 2 3; do
  for build in old new; do
    bin=dist/tiermem; [ $build = old ] && bin=dist/old/tiermem
    echo "=== bench tenants throughput, $build build, run $i" | tee -a "$log"
    TIERMEM_COMMIT=$build-$i timeout 100 $bin bench tenants --json "$out/tenants-$build-$i" --throughput-only 2>&1 | grep -E "GB/s" | tee -a "$log"
  done
done
tar -C "$out" -cJf "$out/../tenants-ab.tar.xz" .
