#!/usr/bin/env bash
# followup41c's pair run alone, A traced, everything tarred (a nested folder does not come back).
# Usage (on the GPU machine, two GPUs, dist/ built here): followup41d.sh OUT
set -u
out=$1
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out/pair"
A_ENV="TIERMEM_TRACE=$out/pair/a-trace.jsonl" PEER_POOL=6GiB HBM_POOL=12GiB A_FULL_GIB=11 STEPS=40 TIERMEM_PEERS=off \
  timeout 230 "$here/daemon_transparent.sh" "$PWD/dist/tiermem" "$out/pair" > "$out/pair.log" 2>&1
echo "pair: exit $?"
python3 "$here/lease_summary.py" "$out/pair/summary.json" pair
tail -12 "$out/pair/train.log" | cut -c1-300
(cd "$out" && tar cJf pair.tar.xz pair && rm -rf pair)
exit 0
