#!/usr/bin/env bash
# Why the training loop's steps took 2.7-9.9 s while a newcomer ran beside it on the pair
# (followup41b), when the same tiers alone give 1.03 s (three_tiers.sh, peer4):
#  1. the same tiers alone, with a plain program hammering GPU 0 as the newcomer does (GPU
#     contention without the daemon), and 10 GiB host-only the same way;
#  2. the pair run again, A traced (TIERMEM_TRACE): where its slow steps go.
# Results under OUT. Usage (on the GPU machine, two GPUs, dist/ built here): followup41c.sh OUT
set -u
out=$1
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
for label in peer4 host10; do
  python3 "$here/hammer.py" 70 > "$out/hammer-$label.log" 2>&1 &
  hammer=$!
  sleep 3
  if [ "$label" = peer4 ]; then
    env TIERMEM_PEERS=1 TIERMEM_PEER_LIMIT=4GiB timeout 120 ./dist/tiermem run --stats --hbm-limit 6GiB -- \
      python3 bench/transparent_train.py --steps 10 --out "$out/$label-contended.json" 2> "$out/$label-contended.log"
  else
    env TIERMEM_PEERS=off timeout 120 ./dist/tiermem run --stats --hbm-limit 10GiB -- \
      python3 bench/transparent_train.py --steps 10 --out "$out/$label-contended.json" 2> "$out/$label-contended.log"
  fi
  echo "$label contended: exit $? $(python3 -c "import json; d=json.load(open('$out/$label-contended.json')); print('median', d.get('step_s_median'), [round(s,2) for s in d['step_s']])" 2>/dev/null)"
  grep "migration on\|moves:\|segments on" "$out/$label-contended.log" | cut -c16-240
  kill $hammer 2>/dev/null; wait $hammer 2>/dev/null
done
mkdir -p "$out/pair"
A_ENV="TIERMEM_TRACE=$out/pair/a-trace.jsonl" PEER_POOL=6GiB HBM_POOL=12GiB A_FULL_GIB=11 STEPS=40 TIERMEM_PEERS=off \
  timeout 230 "$here/daemon_transparent.sh" "$PWD/dist/tiermem" "$out/pair" > "$out/pair.log" 2>&1
echo "pair: exit $?"
python3 "$here/lease_summary.py" "$out/pair/summary.json" pair
xz -T4 "$out/pair/a-trace.jsonl" "$out/pair/status.jsonl" 2>/dev/null
exit 0
