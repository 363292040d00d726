#!/usr/bin/env bash
# The fiftieth session, last call: zero fills take the physical chunks of dirty chunks still
# copied down (hand_overs.rs). Engine tests on the GPU; the training profile (activations only
# twice, fully offloaded once); the tenant worker (2 ms of host work and none); `bench engine`
# and the torch benchmark into OUT/results.
# Usage (GPU machine; dist/ built here): followup50d.sh OUT COMMIT
set -u
out=$1 commit=$2; mkdir -p "$out/results"; log=$out/summary.txt
export TIERMEM_PEERS=off
for t in handover schedule schedule_recorded discard learned_loops; do
  TIERMEM_TEST_BACKEND=cuda timeout 120 dist/tests/$t > "$out/test-$t.log" 2>&1
  echo "test $t exit $? $(grep 'test result' "$out/test-$t.log")" | tee -a "$log"
done
python3 -m pip install -q --no-index --no-deps --force-reinstall dist/wheels/tiermem-*.whl 2>&1 | tail -2
show='import json,sys; d=json.load(open(sys.argv[1])); m=d["median"]; print(round(d["step_s"],3), {p: {k: round(m[p][k],3) for k in ("s","evict_wait_ms","stall_ms","map_ms")} for p in ("forward","backward","step")})'
for rep in 1 2; do
  timeout 150 python3 scripts/gpu/probes/train_profile.py --steps 6 --activations-only 2048 > "$out/acts-$rep.json" 2> "$out/acts-$rep.log"
  echo "activations only $rep exit $? $(python3 -c "$show" "$out/acts-$rep.json")" | tee -a "$log"
done
timeout 150 python3 scripts/gpu/probes/train_profile.py --steps 6 > "$out/train.json" 2> "$out/train.log"
echo "train exit $? $(python3 -c "$show" "$out/train.json")" | tee -a "$log"
ws=$((8 * 1024 * 6 / 10))MiB
brief='import json,sys; v=json.loads(sys.stdin.read().strip().splitlines()[-1]); print("s=%.3f in=%.2fGB evict_wait=%.0f bad=%s" % (v["seconds"], v["paged_in_bytes"]/1e9, v["evict_wait_ms"], v["mismatched_words"]))'
for think in 2 0; do
  line=$(TIERMEM_DAEMON=off TIERMEM_HBM_LIMIT=2730MiB timeout 60 dist/tiermem bench tenant-worker --working-set $ws --buffer-size 128MiB --rounds 20 --think-ms $think | tail -1)
  echo "$line" > "$out/worker-$think.json"
  echo "worker think=$think $(echo "$line" | python3 -c "$brief")" | tee -a "$log"
done
TIERMEM_COMMIT=$commit timeout 120 dist/tiermem bench engine --json "$out/results" > "$out/engine.log" 2>&1
echo "bench engine exit $?: $(grep -iE 'page-in|exchange' "$out/engine.log" | tail -2 | tr '\n' ' ')" | tee -a "$log"
timeout 200 python3 bench/torch_bench.py --json "$out/results" --commit "$commit" --scratch "$PWD" > "$out/torch.log" 2>&1
echo "torch exit $?: $(grep -E '"(vs_pcie_bound|tied_vs_pcie_bound|wake_vs_pcie|moe_vs_pcie_bound|moe_12_layer_vs_pcie_bound)"' "$out/torch.log" | tr -d ' \n') $(grep -E '^training' "$out/torch.log" | cut -c1-40)" | tee -a "$log"
echo "=== done ($(date +%T))"
