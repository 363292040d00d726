#!/usr/bin/env bash
# The twenty-fourth session's work, for the next GPU call: the Python tests on the GPU (a pinned
# model's tests among them), the torch benchmark (the pinned decodes beside the plain and the
# hooked ones, `*_pinned_decode_tok_s` and `*_pinned_identical`, and the new `serving` part),
# bench engine (`advance_resident_us`: advance along a schedule that fits, once O(chunks), now
# at once), and tenants with longer jobs (start-up, ~1.4 s of a 3.4 s set at the default 5
# rounds, is the same in every mode and dilutes vs_static): 5 rounds beside 20.
# All of it takes ~15 minutes, more than one call may run: pick parts, e.g. two calls with
# PARTS="tests torch" and PARTS="engine tenants".
# Usage (on the GPU machine, after scripts/gpu/build.sh here):
#   PARTS="tests torch engine tenants" scripts/gpu/probes/pin_and_memo.sh OUT COMMIT
set -u
out=$1 commit=$2
parts=${PARTS:-tests torch engine tenants}
mkdir -p "$out"; log=$out/log.txt
python3 -m pip install -q --no-index --no-deps dist/wheels/*.whl
for part in $parts; do
  case $part in
    tests)
      echo "=== Python tests on the GPU" | tee -a "$log"
      TIERMEM_PEERS=off TIERMEM_TEST_BACKEND=cuda timeout 150 python3 -m pytest -q -rs python/tests > "$out/pytest.txt" 2>&1
      tail -3 "$out/pytest.txt" | tee -a "$log" ;;
    torch)
      echo "=== torch benchmark" | tee -a "$log"
      TIERMEM_PEERS=off timeout 420 python3 bench/torch_bench.py --json "$out/torch" --commit "$commit" --scratch "$PWD" > "$out/torch.txt" 2>&1
      grep -E "of the PCIe bound|accelerate|wake:|^load|traffic|pinned|without tiermem|serving" "$out/torch.txt" | tail -20 | tee -a "$log" ;;
    engine)
      echo "=== bench engine" | tee -a "$log"
      TIERMEM_PEERS=off TIERMEM_COMMIT=$commit timeout 80 dist/tiermem bench engine --json "$out/engine" 2>&1 \
        | grep -E "page-in|page-out|exchange|acquire|advance|oversubscribed|learned" | tee -a "$log" ;;
    tenants)
      for r in 5 20; do
        echo "=== bench tenants, throughput only, rounds $r" | tee -a "$log"
        TIERMEM_PEERS=off TIERMEM_COMMIT=$commit-rounds-$r timeout 240 dist/tiermem bench tenants --json "$out/tenants-r$r" \
          --throughput-only --rounds $r 2>&1 | grep -E "GB/s|vs_" | tee -a "$log"
      done ;;
    *) echo "unknown part $part (tests, torch, engine, tenants)" | tee -a "$log" ;;
  esac
done
tar -C "$out" -cJf "$out/../pin-and-memo-${parts// /-}.tar.xz" .
