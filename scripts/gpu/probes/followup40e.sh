#!/usr/bin/env bash
# The fortieth session's last GPU call (issue 16): stage 3's trial as mended after followup40d
# (pace over windows, stage 3's samples from followed cycles) — policies.py with auto with and
# without the trial, on the decoder at 0.5x and the training loop at 0.7x (the benchmark's
# loop, budget and steps). Results under OUT. Usage: followup40e.sh OUT
set -u
out=$1
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
export TIERMEM_PEERS=off POLICIES=auto
timeout 230 python3 "$here/policies.py" "$PWD/dist/tiermem" "$out" 2>&1 | cut -c1-700
exit 0
