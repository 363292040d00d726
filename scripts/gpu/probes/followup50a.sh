#!/usr/bin/env bash
# The fiftieth session, first call: the forty-ninth's final code (dirty holders handed over,
# clean ones waited for) re-proved — `bench engine`, the torch benchmark, the training profile
# fully offloaded and activations only, the tenant worker, then `bench transparent`.
# Usage (GPU machine; dist/ built here): followup50a.sh OUT COMMIT
set -u
out=$1 commit=$2; mkdir -p "$out/results"; log=$out/summary.txt
export TIERMEM_PEERS=off
TIERMEM_COMMIT=$commit timeout 120 dist/tiermem bench engine --json "$out/results" > "$out/engine.log" 2>&1
echo "bench engine exit $?: $(grep -iE 'page-in|page-out|both' "$out/engine.log" | tail -4 | tr '\n' ' ')" | tee -a "$log"
python3 -m pip install -q --no-index --no-deps --force-reinstall dist/wheels/tiermem-*.whl 2>&1 | tail -2
timeout 200 python3 bench/torch_bench.py --json "$out/results" --commit "$commit" --scratch "$PWD" > "$out/torch.log" 2>&1
echo "torch exit $?: $(grep -E 'of the PCIe bound|identical|training|wake' "$out/torch.log" | tail -10 | tr '\n' ' ')" | tee -a "$log"
show='import json,sys; d=json.load(open(sys.argv[1])); print(round(d["step_s"],3), {k: round(d["median"]["forward"][k],3) for k in ("s","evict_wait_ms","stall_ms")})'
timeout 150 python3 scripts/gpu/probes/train_profile.py --steps 7 > "$out/train.json" 2> "$out/train.log"
echo "train exit $? $(python3 -c "$show" "$out/train.json")" | tee -a "$log"
timeout 150 python3 scripts/gpu/probes/train_profile.py --steps 7 --activations-only 2048 > "$out/acts-only.json" 2> "$out/acts-only.log"
echo "activations only exit $? $(python3 -c "$show" "$out/acts-only.json")" | tee -a "$log"
ws=$((8 * 1024 * 6 / 10))MiB
brief='import json,sys; v=json.loads(sys.stdin.read().strip().splitlines()[-1]); print("s=%.3f in=%.2fGB evict_wait=%.0f bad=%s" % (v["seconds"], v["paged_in_bytes"]/1e9, v["evict_wait_ms"], v["mismatched_words"]))'
for think in 2 0; do
  line=$(TIERMEM_DAEMON=off TIERMEM_HBM_LIMIT=2730MiB timeout 60 dist/tiermem bench tenant-worker --working-set $ws --buffer-size 128MiB --rounds 20 --think-ms $think | tail -1)
  echo "$line" > "$out/worker-$think.json"
  echo "worker think=$think $(echo "$line" | python3 -c "$brief")" | tee -a "$log"
done
echo "transparent from $(date +%T)" | tee -a "$log"
TIERMEM_COMMIT=$commit timeout 330 dist/tiermem bench transparent --json "$out/results" > "$out/transparent.log" 2>&1
echo "bench transparent exit $?: $(tail -8 "$out/transparent.log" | tr '\n' ' ')" | tee -a "$log"
echo "=== done ($(date +%T))"
