#!/usr/bin/env bash
# The engine's chunk size (TIERMEM_CHUNK), A/B in one call: the MoE and tied decodes, the tied
# model's load and its wake after a sleep, at chunks of 2 MiB (one granule), 4 MiB and 8 MiB.
# Usage (on the GPU machine, after scripts/gpu/build.sh here): scripts/gpu/probes/chunk_ab.sh OUT COMMIT [CHUNKS...]
set -u
out=$1 commit=$2; shift 2
chunks=${*:-2MiB 8MiB 4MiB 8MiB 2MiB}
mkdir -p "$out/all"; log=$out/all/log.txt
python3 -m pip install -q --no-index --no-deps dist/wheels/tiermem-*.whl
n=0
for chunk in $chunks; do
  n=$((n + 1))
  echo "=== run $n, chunks of $chunk" | tee -a "$log"
  start=$(date +%s)
  TIERMEM_CHUNK=$chunk timeout 150 python3 bench/torch_bench.py --json "$out/all" --commit "$commit-$n-chunk-$chunk" \
    --parts moe,tied --scratch "$PWD" > "$out/all/torch-$n-$chunk.log" 2>&1
  grep -E "of the PCIe bound|all resident|wake:|load|identical" "$out/all/torch-$n-$chunk.log" | grep -v "Loading\|it/s\]" | tail -12 | tee -a "$log"
  echo "($(( $(date +%s) - start )) s)" | tee -a "$log"
done
tar -C "$out" -cJf "$out/all.tar.xz" all
