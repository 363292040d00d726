#!/usr/bin/env bash
# The forty-ninth session: homes handed over (placement.rs, `send_home`) against waiting for the
# holders' copies down, before/after alternated on one machine. (1) One tenant worker streaming
# dirty 128 MiB buffers (0.6x an 8 GiB node cap) under caps of a third and a half of it, with
# 2 ms of host work per buffer and none, and three at once; (2) the training profile, fully
# offloaded and activations only; (3) `bench engine` after.
# Usage (GPU machine; dist/tiermem-before, dist/tiermem, dist/wheels-old, dist/wheels): followup49a.sh OUT COMMIT
set -u
out=$1 commit=${2:-dev}; mkdir -p "$out"; log=$out/summary.txt
export TIERMEM_PEERS=off TIERMEM_DAEMON=off
ws=$((8 * 1024 * 6 / 10))MiB
brief='import json,sys; v=json.loads(sys.stdin.read().strip().splitlines()[-1]); print("s=%.3f in=%.2fGB stall=%.0f evict_wait=%.0f map_ms=%.0f bad=%s" % (v["seconds"], v["paged_in_bytes"]/1e9, v["stall_ms"], v["evict_wait_ms"], v["rounds_trace"][-1][5], v["mismatched_words"]))'
worker() { # binary cap_mib think
  TIERMEM_HBM_LIMIT=$2MiB timeout 60 "$1" bench tenant-worker --working-set $ws --buffer-size 128MiB --rounds 20 --think-ms $3
}
for rep in 1 2; do
  for think in 2 0; do for cap in 2730 4096; do for which in before after; do
    bin=dist/tiermem; [ $which = before ] && bin=dist/tiermem-before
    worker $bin $cap $think > "$out/one-$which-$cap-$think-$rep.json"
    echo "rep=$rep think=$think cap=$cap $which $(python3 -c "$brief" < "$out/one-$which-$cap-$think-$rep.json")" | tee -a "$log"
  done; done; done
  for which in before after; do
    bin=dist/tiermem; [ $which = before ] && bin=dist/tiermem-before
    start=$(date +%s%N)
    for i in 1 2 3; do worker $bin 2730 2 > "$out/three-$which-$rep-$i.json" & done; wait
    echo "rep=$rep three at once $which wall=$(( ($(date +%s%N) - start) / 1000000 ))ms $(for i in 1 2 3; do python3 -c "$brief" < "$out/three-$which-$rep-$i.json" | cut -d' ' -f1,4; done | tr '\n' ' ')" | tee -a "$log"
  done
done
install() { python3 -m pip install -q --no-index --no-deps --force-reinstall "$1"/tiermem-*.whl 2>&1 | tail -2; }
show() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('  step_s', round(d['step_s'],3)); [print('  ', p, {k: d['median'][p][k] for k in ('s','bytes_in','bytes_out','evict_wait_ms','stall_ms','map_ms')}) for p in d['median']]" "$1" 2>&1 | tail -4; }
for round in 1 2; do
  for which in old new; do
    install dist/wheels$([ $which = old ] && echo -old)
    timeout 150 python3 scripts/gpu/probes/train_profile.py --steps 7 > "$out/train-$which-$round.json" 2> "$out/train-$which-$round.log"
    echo "train $which $round exit $?" | tee -a "$log"; show "$out/train-$which-$round.json" | tee -a "$log"
  done
done
for which in old new; do
  install dist/wheels$([ $which = old ] && echo -old)
  timeout 150 python3 scripts/gpu/probes/train_profile.py --steps 7 --activations-only 2048 > "$out/acts-only-$which.json" 2> "$out/acts-only-$which.log"
  echo "activations only $which exit $?" | tee -a "$log"; show "$out/acts-only-$which.json" | tee -a "$log"
done
TIERMEM_COMMIT=$commit timeout 120 dist/tiermem bench engine --json "$out" > "$out/engine.log" 2>&1
echo "bench engine exit $?: $(grep -E 'ratio|verified' "$out/engine.log" | tr '\n' ' ' | cut -c1-600)" | tee -a "$log"
echo "=== done ($(date +%T))"
