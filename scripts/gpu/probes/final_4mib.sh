#!/usr/bin/env bash
# The twenty-third session's last call: the Python tests on the GPU, the torch benchmark at the
# default chunk (4 MiB), and bench engine at 4 MiB and at 2 MiB (one granule) side by side.
# Usage (on the GPU machine, after scripts/gpu/build.sh here): scripts/gpu/probes/final_4mib.sh OUT COMMIT
set -u
out=$1 commit=$2
mkdir -p "$out"; log=$out/log.txt
python3 -m pip install -q --no-index --no-deps dist/wheels/*.whl
echo "=== Python tests on the GPU" | tee -a "$log"
TIERMEM_PEERS=off TIERMEM_TEST_BACKEND=cuda timeout 150 python3 -m pytest -q -rs python/tests > "$out/pytest.txt" 2>&1
tail -3 "$out/pytest.txt" | tee -a "$log"
echo "=== torch benchmark" | tee -a "$log"
TIERMEM_PEERS=off timeout 330 python3 bench/torch_bench.py --json "$out/torch" --commit "$commit" --scratch "$PWD" > "$out/torch.txt" 2>&1
grep -E "of the PCIe bound|accelerate|wake:|^load|traffic" "$out/torch.txt" | grep -v "host time" | tail -14 | tee -a "$log"
for chunk in 4MiB 2MiB; do
  echo "=== bench engine, chunks of $chunk" | tee -a "$log"
  TIERMEM_PEERS=off TIERMEM_CHUNK=$chunk TIERMEM_COMMIT=$commit-chunk-$chunk timeout 70 dist/tiermem bench engine --json "$out/engine-$chunk" 2>&1 \
    | grep -E "page-in|page-out|exchange|acquire|oversubscribed|learned" | tee -a "$log"
done
tar -C "$out" -cJf "$out/../final.tar.xz" .
