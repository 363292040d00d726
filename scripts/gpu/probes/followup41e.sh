#!/usr/bin/env bash
# The forty-first session's check of move_price.rs (stage 3's pauses skipped while a move's
# driver steps cost over 10x their cheapest) on the H200 pair:
#  1. three_tiers.sh's peer4 alone (6 GiB of HBM, 4 GiB of GPU 1's, the rest on the host): no
#     pause may be skipped alone (no "moves priced" line), steps as before (1.03 s);
#  2. the pair run of followup41b/d (the newcomer beside the training loop): A's steps while B ran
#     (before: 2.74/9.94/5.79 s and 4.44/12.53/3.53 s).
# Results under OUT (tarred). Usage (on the GPU machine, two GPUs, dist/ built here): followup41e.sh OUT
set -u
out=$1
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out/pair"
env TIERMEM_PEERS=1 TIERMEM_PEER_LIMIT=4GiB timeout 120 ./dist/tiermem run --stats --hbm-limit 6GiB -- \
  python3 bench/transparent_train.py --steps 10 --out "$out/peer4.json" 2> "$out/peer4.log"
echo "peer4 alone: exit $? $(python3 -c "import json; d=json.load(open('$out/peer4.json')); print('median', d.get('step_s_median'), [round(s,2) for s in d['step_s']])" 2>/dev/null)"
grep "segments on\|moves priced" "$out/peer4.log" | cut -c16-300
PEER_POOL=6GiB HBM_POOL=12GiB A_FULL_GIB=11 STEPS=40 TIERMEM_PEERS=off \
  timeout 230 "$here/daemon_transparent.sh" "$PWD/dist/tiermem" "$out/pair" > "$out/pair.log" 2>&1
echo "pair: exit $?"
python3 "$here/lease_summary.py" "$out/pair/summary.json" pair
grep "segments on\|moves priced\|migration on" "$out/pair/train.log" | cut -c1-300
(cd "$out" && tar cJf pair.tar.xz pair && rm -rf pair)
exit 0
