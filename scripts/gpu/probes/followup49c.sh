#!/usr/bin/env bash
# The forty-ninth session, third call: how far the host may run ahead of the moves it handed
# over (TIERMEM_PROBE_HANDED_AHEAD, MiB of chunks handed over and still moving; 0 = the paced
# send_home, 100000 = unpaced), against before: the tenant worker link-bound (alone, no host
# work; three at once with 2 ms) and the training profile fully offloaded.
# Usage (GPU machine; dist/tiermem{-before,}, dist/wheels{-old,}): followup49c.sh OUT
set -u
out=$1; mkdir -p "$out"; log=$out/summary.txt
export TIERMEM_PEERS=off TIERMEM_DAEMON=off
ws=$((8 * 1024 * 6 / 10))MiB
brief='import json,sys; v=json.loads(sys.stdin.read().strip().splitlines()[-1]); print("s=%.3f in=%.2fGB evict_wait=%.0f bad=%s" % (v["seconds"], v["paged_in_bytes"]/1e9, v["evict_wait_ms"], v["mismatched_words"]))'
worker() { TIERMEM_HBM_LIMIT=$2MiB timeout 60 "$1" bench tenant-worker --working-set $ws --buffer-size 128MiB --rounds 20 --think-ms $3; }
install() { python3 -m pip install -q --no-index --no-deps --force-reinstall "$1"/tiermem-*.whl 2>&1 | tail -2; }
show() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('  step_s', round(d['step_s'],3), 'forward', {k: round(d['median']['forward'][k],3) for k in ('s','evict_wait_ms','stall_ms')})" "$1" 2>&1 | tail -2; }
for rep in 1 2; do
  for ahead in before 0 256 1024 100000; do
    bin=dist/tiermem; [ $ahead = before ] && bin=dist/tiermem-before
    export TIERMEM_PROBE_HANDED_AHEAD=$ahead
    for cap in 2730 4096; do
      worker $bin $cap 0 > "$out/one-$ahead-$cap-$rep.json"
      echo "rep=$rep ahead=$ahead think=0 cap=$cap $(python3 -c "$brief" < "$out/one-$ahead-$cap-$rep.json")" | tee -a "$log"
    done
    start=$(date +%s%N)
    for i in 1 2 3; do worker $bin 2730 2 > "$out/three-$ahead-$rep-$i.json" & done; wait
    echo "rep=$rep ahead=$ahead three at once wall=$(( ($(date +%s%N) - start) / 1000000 ))ms" | tee -a "$log"
  done
done
for rep in 1; do
  for ahead in before 0 256 1024 100000; do
    export TIERMEM_PROBE_HANDED_AHEAD=$ahead
    install dist/wheels$([ $ahead = before ] && echo -old)
    timeout 150 python3 scripts/gpu/probes/train_profile.py --steps 7 > "$out/train-$ahead-$rep.json" 2> "$out/train-$ahead-$rep.log"
    echo "train ahead=$ahead rep=$rep exit $? $(show "$out/train-$ahead-$rep.json")" | tee -a "$log"
  done
done
echo "=== done ($(date +%T))"
