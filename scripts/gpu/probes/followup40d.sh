#!/usr/bin/env bash
# The fortieth session's fourth GPU call (issue 16), on one GPU: stage 3 on trial (da3039c) —
# policies.py (auto with and without the trial, hotness: a decoder at 0.5x, the training loop at
# 0.7x), then `bench transparent --matrix none` (does the trial cost the benchmark's loop?).
# Results under OUT. Usage (on the GPU machine, after building dist/ here): followup40d.sh OUT COMMIT
set -u
out=$1 commit=$2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
export TIERMEM_PEERS=off
timeout 260 python3 "$here/policies.py" "$PWD/dist/tiermem" "$out" 2>&1 | cut -c1-600
TIERMEM_COMMIT=$commit timeout 300 "$PWD/dist/tiermem" bench transparent --json "$out" --matrix none > "$out/transparent.log" 2>&1
echo "bench transparent: exit $?"; grep -A8 '"ratios"' "$out"/transparent-*.json | head -9
exit 0
