#!/usr/bin/env bash
# The forty-ninth session, last call, at the commit with hand-overs: engine tests on the GPU,
# the tenant worker before/after once more, then `bench engine`, the torch benchmark and
# `bench tenants` (3 repeats) into OUT/results.
# Usage (GPU machine; dist/ built here): followup49d.sh OUT COMMIT
set -u
out=$1 commit=$2; mkdir -p "$out/results"; log=$out/summary.txt
export TIERMEM_PEERS=off
for t in schedule learned_loops discard; do
  TIERMEM_TEST_BACKEND=cuda timeout 120 dist/tests/$t > "$out/test-$t.log" 2>&1
  echo "test $t exit $? $(grep 'test result' "$out/test-$t.log")" | tee -a "$log"
done
ws=$((8 * 1024 * 6 / 10))MiB
brief='import json,sys; v=json.loads(sys.stdin.read().strip().splitlines()[-1]); print("s=%.3f in=%.2fGB evict_wait=%.0f bad=%s" % (v["seconds"], v["paged_in_bytes"]/1e9, v["evict_wait_ms"], v["mismatched_words"]))'
for think in 2 0; do for rep in 1 2; do for bin in tiermem-before tiermem; do
  line=$(TIERMEM_DAEMON=off TIERMEM_HBM_LIMIT=2730MiB timeout 60 dist/$bin bench tenant-worker --working-set $ws --buffer-size 128MiB --rounds 20 --think-ms $think | tail -1)
  echo "$line" > "$out/worker-$bin-$think-$rep.json"
  echo "worker think=$think rep=$rep $bin $(echo "$line" | python3 -c "$brief")" | tee -a "$log"
done; done; done
TIERMEM_COMMIT=$commit timeout 120 dist/tiermem bench engine --json "$out/results" > "$out/engine.log" 2>&1
echo "bench engine exit $?" | tee -a "$log"
python3 -m pip install -q --no-index --no-deps --force-reinstall dist/wheels/tiermem-*.whl 2>&1 | tail -2
timeout 200 python3 bench/torch_bench.py --json "$out/results" --commit "$commit" --scratch "$PWD" > "$out/torch.log" 2>&1
echo "torch exit $?: $(grep -E 'of the PCIe bound|identical|training' "$out/torch.log" | tail -8 | tr '\n' ' ')" | tee -a "$log"
TIERMEM_COMMIT=$commit timeout 330 dist/tiermem bench tenants --json "$out/results" --repeats 3 > "$out/tenants.log" 2>&1
echo "bench tenants exit $?: $(tail -12 "$out/tenants.log" | tr '\n' ' ')" | tee -a "$log"
echo "=== done ($(date +%T))"
