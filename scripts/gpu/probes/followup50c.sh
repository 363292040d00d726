#!/usr/bin/env bash
# The fiftieth session: hand-overs beyond homes. One build, three scopes
# (TIERMEM_PROBE_HAND_OVER: homes = the forty-ninth session's; demand = a demand making room
# hands over dirty chunks too; all = page-aheads too), alternated: the training profile with
# activations only beside a resident model and fully offloaded, the tenant worker (dirty
# 128 MiB buffers, 2 ms of host work and none).
# Usage (GPU machine; dist/ built here): followup50c.sh OUT
set -u
out=$1; mkdir -p "$out"; log=$out/summary.txt
export TIERMEM_PEERS=off
python3 -m pip install -q --no-index --no-deps --force-reinstall dist/wheels/tiermem-*.whl 2>&1 | tail -2
show='import json,sys; d=json.load(open(sys.argv[1])); m=d["median"]; print(round(d["step_s"],3), {p: {k: round(m[p][k],3) for k in ("s","evict_wait_ms","stall_ms","map_ms")} for p in ("forward","backward","step")})'
ws=$((8 * 1024 * 6 / 10))MiB
brief='import json,sys; v=json.loads(sys.stdin.read().strip().splitlines()[-1]); print("s=%.3f in=%.2fGB evict_wait=%.0f bad=%s" % (v["seconds"], v["paged_in_bytes"]/1e9, v["evict_wait_ms"], v["mismatched_words"]))'
for rep in 1 2; do for scope in homes all demand; do
  [ $rep = 2 ] && [ $scope = demand ] && continue
  export TIERMEM_PROBE_HAND_OVER=$scope
  timeout 150 python3 scripts/gpu/probes/train_profile.py --steps 6 --activations-only 2048 > "$out/acts-$scope-$rep.json" 2> "$out/acts-$scope-$rep.log"
  echo "activations only $scope $rep exit $? $(python3 -c "$show" "$out/acts-$scope-$rep.json")" | tee -a "$log"
  timeout 150 python3 scripts/gpu/probes/train_profile.py --steps 6 > "$out/train-$scope-$rep.json" 2> "$out/train-$scope-$rep.log"
  echo "train $scope $rep exit $? $(python3 -c "$show" "$out/train-$scope-$rep.json")" | tee -a "$log"
  for think in 2 0; do
    line=$(TIERMEM_DAEMON=off TIERMEM_HBM_LIMIT=2730MiB timeout 60 dist/tiermem bench tenant-worker --working-set $ws --buffer-size 128MiB --rounds 20 --think-ms $think | tail -1)
    echo "$line" > "$out/worker-$scope-$think-$rep.json"
    echo "worker $scope think=$think $rep $(echo "$line" | python3 -c "$brief")" | tee -a "$log"
  done
done; done
echo "=== done ($(date +%T))"
