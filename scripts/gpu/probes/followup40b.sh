#!/usr/bin/env bash
# The fortieth session's second GPU call, on one GPU:
#  1. `bench transparent --matrix none` at this build: stage 2's fill of free room (0c97bf2, on by
#     default) first measured here — does the loop keep 0.383 / 0.254 at 0.7x / 0.5x?
#  2. host chunks made ahead of a cut, A/B (spares_ahead.sh, 100 steps so that A runs at its
#     share for a while: lease_summary.py gives the cut's cost over that pace).
# Results under OUT. Usage (on the GPU machine, after building dist/ here): followup40b.sh OUT COMMIT
set -u
out=$1 commit=$2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
export TIERMEM_PEERS=off
TIERMEM_COMMIT=$commit timeout 320 "$PWD/dist/tiermem" bench transparent --json "$out" --matrix none > "$out/transparent.log" 2>&1
echo "bench transparent: exit $?"; grep -A12 '"ratios"' "$out"/transparent-*.json | head -14

STEPS=100 RUN_TIMEOUT=130 "$here/spares_ahead.sh" "$out"
exit 0
