#!/usr/bin/env bash
# What the thirty-ninth session built without device time, measured (issues 13, 16), in one call:
#  1. on two GPUs, the daemon leasing neighbours' HBM (daemon_transparent.sh with PEER_POOL):
#     does A's peer budget stay at its share while B's HBM grant is staged (f5c4025; before: 6 →
#     3 → 4 GiB), and how fast does B fill the HBM it was granted (0c97bf2: before, 8.6 s)?
#  2. host chunks made ahead of a cut (spares_ahead.sh: TIERMEM_SPARES_AHEAD off, then on).
# Each run's line comes from lease_summary.py; results under OUT. Before: the thirty-ninth
# session's pair run, probes-20261129e/daemon-peers-x2/summary.json (slowest steps 2.9, 5.0, 13.3
# s, median 0.353, B's fill 8.63 s, A's least peer budget 3072 MiB).
# Usage (on the GPU machine, after building dist/ here): scripts/gpu/probes/followup39.sh OUT
set -u
out=$1
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  PEER_POOL=6GiB HBM_POOL=12GiB A_FULL_GIB=11 STEPS=40 TIERMEM_PEERS=off timeout 200 \
    "$here/daemon_transparent.sh" "$PWD/dist/tiermem" "$out/pair" > "$out/pair.log" 2>&1
  python3 "$here/lease_summary.py" "$out/pair/summary.json" pair
fi
"$here/spares_ahead.sh" "$out"
exit 0
