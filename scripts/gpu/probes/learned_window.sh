#!/usr/bin/env bash
# A learned loop's paging-ahead window against host time between acquires: one tenant worker
# (dirty 128 MiB buffers, 0.6x an 8 GiB node cap) alone under a cap, windows of 256 MiB to
# 1 GiB (TIERMEM_PROBE_WINDOW_SHARE lifts the eighth-of-the-budget limit on the probe branch),
# with and without 2 ms of host think per buffer; then three at once (link-bound).
# Usage (GPU machine): scripts/gpu/probes/learned_window.sh OUT
set -u
out=$1; mkdir -p "$out"; log=$out/log.txt
export TIERMEM_PEERS=off TIERMEM_DAEMON=off TIERMEM_PROBE_WINDOW_SHARE=2
ws=$((8 * 1024 * 6 / 10))MiB
worker() { # cap_mib window think
  TIERMEM_HBM_LIMIT=$1MiB TIERMEM_LEARN_LOOPS=$2 timeout 60 dist/tiermem bench tenant-worker \
    --working-set $ws --buffer-size 128MiB --rounds 20 --think-ms $3 | tail -1
}
for rep in 1 2; do
  for think in 2 0; do for cap in 2730 4096; do for w in 256MiB 512MiB 1GiB; do
    line=$(worker $cap $w $think)
    echo "rep=$rep think=$think cap=$cap window=$w $(echo "$line" | python3 -c 'import json,sys; v=json.loads(sys.stdin.read()); print("s=%.3f in=%.2fGB stall=%.0f evict_wait=%.0f bad=%s" % (v["seconds"], v["paged_in_bytes"]/1e9, v["stall_ms"], v["evict_wait_ms"], v["mismatched_words"]))')" | tee -a "$log"
  done; done; done
  for w in 256MiB 512MiB; do
    start=$(date +%s%N)
    for i in 1 2 3; do worker 2730 $w 2 > "$out/three-$rep-$w-$i.json" & done; wait
    echo "rep=$rep three at once window=$w wall=$(( ($(date +%s%N) - start) / 1000000 ))ms $(cat $out/three-$rep-$w-*.json | python3 -c 'import json,sys; print(" ".join("s=%.3f" % json.loads(l)["seconds"] for l in sys.stdin))')" | tee -a "$log"
  done
done
