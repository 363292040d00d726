#!/usr/bin/env bash
# The engine's chunk size (TIERMEM_CHUNK), second A/B in one call: 2 MiB (one granule) against
# 4 MiB, interleaved: bench engine, the MoE and tied decodes with load and wake (twice each),
# bench tenants' throughput sets, and the dense decode.
# Usage (on the GPU machine, after scripts/gpu/build.sh here): scripts/gpu/probes/chunk_ab2.sh OUT COMMIT
set -u
out=$1 commit=$2
mkdir -p "$out/all"; log=$out/all/log.txt
python3 -m pip install -q --no-index --no-deps dist/wheels/tiermem-*.whl
tied_moe() {  # $1 run label, $2 chunk
  echo "=== $1: moe,tied, chunks of $2" | tee -a "$log"
  TIERMEM_CHUNK=$2 timeout 100 python3 bench/torch_bench.py --json "$out/all" --commit "$commit-$1-chunk-$2" \
    --parts moe,tied --scratch "$PWD" > "$out/all/torch-$1-$2.log" 2>&1
  grep -E "of the PCIe bound|all resident|wake:|^load" "$out/all/torch-$1-$2.log" | sed 's/host time.*;//' | tee -a "$log"
}
for chunk in 2MiB 4MiB; do
  echo "=== bench engine, chunks of $chunk" | tee -a "$log"
  TIERMEM_CHUNK=$chunk TIERMEM_COMMIT=$commit-chunk-$chunk timeout 60 dist/tiermem bench engine --json "$out/all" 2>&1 | grep -E "page-in|page-out|exchange|acquire" | tail -6 | tee -a "$log"
done
tied_moe r1 2MiB; tied_moe r1 4MiB; tied_moe r2 4MiB; tied_moe r2 2MiB
for chunk in 4MiB 2MiB; do
  echo "=== bench tenants --throughput-only, chunks of $chunk" | tee -a "$log"
  TIERMEM_CHUNK=$chunk TIERMEM_COMMIT=$commit-chunk-$chunk timeout 60 dist/tiermem bench tenants --json "$out/all" --throughput-only 2>&1 | tail -5 | tee -a "$log"
done
for chunk in 2MiB 4MiB; do
  echo "=== dense decode, chunks of $chunk" | tee -a "$log"
  TIERMEM_CHUNK=$chunk timeout 110 python3 bench/torch_bench.py --json "$out/all" --commit "$commit-dense-chunk-$chunk" \
    --parts inference --prefetch 256 --scratch "$PWD" > "$out/all/dense-$chunk.log" 2>&1
  grep -E "of the PCIe bound|traffic|accelerate" "$out/all/dense-$chunk.log" | head -4 | tee -a "$log"
done
tar -C "$out" -cJf "$out/all.tar.xz" all
