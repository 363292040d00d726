#!/usr/bin/env bash
# The thirty-ninth session's question for the next GPU call (issue 16): does making host chunks
# ahead of a cut (TIERMEM_SPARES_AHEAD=on, crates/preload/src/spares.rs) shorten the steps of a
# leased transparent program when a newcomer's arrival cuts its budget? daemon_transparent.sh
# with it off, then on (one GPU: host memory beyond the budget), STEPS steps each.
# Results: OUT/off/, OUT/on/ (summary.json: A's step times, budgets, losses_identical).
# Usage (on the GPU machine, after building dist/ here): scripts/gpu/probes/spares_ahead.sh OUT
set -u
out=$1
export TIERMEM_PEERS=off STEPS=${STEPS:-40}
here=$(cd "$(dirname "$0")" && pwd)
for mode in off on; do
  TIERMEM_SPARES_AHEAD=$mode timeout "${RUN_TIMEOUT:-240}" "$here/daemon_transparent.sh" "$PWD/dist/tiermem" "$out/$mode" > "$out/$mode.log" 2>&1
  python3 "$here/lease_summary.py" "$out/$mode/summary.json" "spares-ahead-$mode"
  grep -h "spares ahead\|creating host" "$out/$mode/train.log" | tail -2
done
exit 0
