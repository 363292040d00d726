#!/usr/bin/env bash
# The twenty-fourth session's work, for the next GPU call: the Python tests on the GPU (a pinned
# model's test among them), the torch benchmark (the pinned decodes beside the plain and the
# hooked ones: `*_pinned_decode_tok_s`, `*_pinned_identical`), and bench engine
# (`advance_resident_us`: advance along a schedule that fits, once O(chunks), now at once).
# Usage (on the GPU machine, after scripts/gpu/build.sh here): scripts/gpu/probes/pin_and_memo.sh OUT COMMIT
set -u
out=$1 commit=$2
mkdir -p "$out"; log=$out/log.txt
python3 -m pip install -q --no-index --no-deps dist/wheels/*.whl
echo "=== Python tests on the GPU" | tee -a "$log"
TIERMEM_PEERS=off TIERMEM_TEST_BACKEND=cuda timeout 150 python3 -m pytest -q -rs python/tests > "$out/pytest.txt" 2>&1
tail -3 "$out/pytest.txt" | tee -a "$log"
echo "=== torch benchmark" | tee -a "$log"
TIERMEM_PEERS=off timeout 420 python3 bench/torch_bench.py --json "$out/torch" --commit "$commit" --scratch "$PWD" > "$out/torch.txt" 2>&1
grep -E "of the PCIe bound|accelerate|wake:|^load|traffic|pinned|without tiermem|serving" "$out/torch.txt" | tail -20 | tee -a "$log"
echo "=== bench engine" | tee -a "$log"
TIERMEM_PEERS=off TIERMEM_COMMIT=$commit timeout 80 dist/tiermem bench engine --json "$out/engine" 2>&1 \
  | grep -E "page-in|page-out|exchange|acquire|advance|oversubscribed|learned" | tee -a "$log"
tar -C "$out" -cJf "$out/../pin-and-memo.tar.xz" .
# Then, if the call has time: tenants with longer jobs (start-up, ~1.4 s of a 3.4 s set at the
# default 5 rounds, is the same in every mode and dilutes vs_static): the default beside 20.
for r in 5 20; do
  echo "=== bench tenants, throughput only, rounds $r" | tee -a "$log"
  TIERMEM_PEERS=off TIERMEM_COMMIT=$commit-rounds-$r timeout 240 dist/tiermem bench tenants --json "$out/tenants-r$r" \
    --throughput-only --rounds $r 2>&1 | grep -E "GB/s|vs_" | tee -a "$log"
done
tar -C "$out" -cJf "$out/../pin-and-memo.tar.xz" .
