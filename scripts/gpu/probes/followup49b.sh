#!/usr/bin/env bash
# The forty-ninth session, second call: homes handed over with the host paced (a hand-over
# first waits for the moves handed over before it) against unpaced and against waiting for the
# holders' copies (before), alternated on one machine: the tenant worker alone and three at
# once (as followup49a.sh), then the training profile, fully offloaded and activations only.
# Usage (GPU machine; dist/tiermem{-before,-unpaced,}, dist/wheels{-old,-unpaced,}): followup49b.sh OUT
set -u
out=$1; mkdir -p "$out"; log=$out/summary.txt
export TIERMEM_PEERS=off TIERMEM_DAEMON=off
ws=$((8 * 1024 * 6 / 10))MiB
brief='import json,sys; v=json.loads(sys.stdin.read().strip().splitlines()[-1]); print("s=%.3f in=%.2fGB stall=%.0f evict_wait=%.0f map_ms=%.0f bad=%s" % (v["seconds"], v["paged_in_bytes"]/1e9, v["stall_ms"], v["evict_wait_ms"], v["rounds_trace"][-1][5], v["mismatched_words"]))'
worker() { # binary cap_mib think
  TIERMEM_HBM_LIMIT=$2MiB timeout 60 "$1" bench tenant-worker --working-set $ws --buffer-size 128MiB --rounds 20 --think-ms $3
}
bin_of() { case $1 in before) echo dist/tiermem-before;; unpaced) echo dist/tiermem-unpaced;; *) echo dist/tiermem;; esac; }
for rep in 1 2; do
  for think in 2 0; do for cap in 2730 4096; do for which in before unpaced paced; do
    worker $(bin_of $which) $cap $think > "$out/one-$which-$cap-$think-$rep.json"
    echo "rep=$rep think=$think cap=$cap $which $(python3 -c "$brief" < "$out/one-$which-$cap-$think-$rep.json")" | tee -a "$log"
  done; done; done
  for which in before unpaced paced; do
    start=$(date +%s%N)
    for i in 1 2 3; do worker $(bin_of $which) 2730 2 > "$out/three-$which-$rep-$i.json" & done; wait
    echo "rep=$rep three at once $which wall=$(( ($(date +%s%N) - start) / 1000000 ))ms $(for i in 1 2 3; do python3 -c "$brief" < "$out/three-$which-$rep-$i.json" | cut -d' ' -f1,4; done | tr '\n' ' ')" | tee -a "$log"
  done
done
install() { python3 -m pip install -q --no-index --no-deps --force-reinstall "$1"/tiermem-*.whl 2>&1 | tail -2; }
wheels_of() { case $1 in old) echo dist/wheels-old;; unpaced) echo dist/wheels-unpaced;; *) echo dist/wheels;; esac; }
show() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('  step_s', round(d['step_s'],3)); [print('  ', p, {k: round(d['median'][p][k],3) for k in ('s','bytes_in','bytes_out','evict_wait_ms','stall_ms','map_ms')}) for p in d['median']]" "$1" 2>&1 | tail -4; }
for round in 1 2; do
  for which in old unpaced paced; do
    install $(wheels_of $which)
    timeout 150 python3 scripts/gpu/probes/train_profile.py --steps 7 > "$out/train-$which-$round.json" 2> "$out/train-$which-$round.log"
    echo "train $which $round exit $?" | tee -a "$log"; show "$out/train-$which-$round.json" | tee -a "$log"
  done
done
for which in old paced; do
  install $(wheels_of $which)
  timeout 150 python3 scripts/gpu/probes/train_profile.py --steps 7 --activations-only 2048 > "$out/acts-only-$which.json" 2> "$out/acts-only-$which.log"
  echo "activations only $which exit $?" | tee -a "$log"; show "$out/acts-only-$which.json" | tee -a "$log"
done
echo "=== done ($(date +%T))"
