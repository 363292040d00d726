#!/usr/bin/env bash
# The thirty-second session's question for the GPU: does a learned loop's page-ahead deeper than
# two buffers remove the eviction waits of `bench tenants`' static thirds and of the daemon's
# two-job phase (BENCHMARKS.md, thirty-second session), and what does it cost where the link
# is the bound (the three-job phase, `bench engine`'s learned loop)? `bench tenants
# --throughput-only` (each set three times, medians) with the window fixed at 256 MiB (the
# default), tuned pass by pass (TIERMEM_TUNE_WINDOW=on), and fixed at 1 GiB (capped at an
# eighth of each budget), in turn; then `bench engine` with the window tuned.
# Usage (on the GPU machine, after scripts/gpu/build.sh here):
#   scripts/gpu/probes/window_ab.sh OUT COMMIT [MODES="fixed tuned deep engine"]
set -u
out=$1 commit=$2 modes=${3:-fixed tuned deep engine}
mkdir -p "$out"; log=$out/log.txt
export TIERMEM_PEERS=off
for mode in $modes; do
  case $mode in
    fixed) env=(TIERMEM_TUNE_WINDOW=off) ;;
    tuned) env=(TIERMEM_TUNE_WINDOW=on) ;;
    deep) env=(TIERMEM_TUNE_WINDOW=off TIERMEM_LEARN_LOOPS=1GiB) ;;
    engine)
      echo "=== bench engine, TIERMEM_TUNE_WINDOW=on ($(date +%T))" | tee -a "$log"
      TIERMEM_TUNE_WINDOW=on TIERMEM_COMMIT=$commit-tuned timeout 150 dist/tiermem bench engine --json "$out/engine-tuned" \
        2>&1 | grep -E "page-in|exchange|advance|loop|verified" | tee -a "$log"
      continue ;;
    *) echo "unknown mode $mode" | tee -a "$log"; continue ;;
  esac
  echo "=== bench tenants --throughput-only, window $mode ($(date +%T))" | tee -a "$log"
  env "${env[@]}" TIERMEM_COMMIT=$commit-$mode timeout 200 dist/tiermem bench tenants --throughput-only \
    --json "$out/tenants-$mode" > "$out/tenants-$mode.log" 2>&1
  grep -E "medians" "$out/tenants-$mode.log" | tee -a "$log"
  for detail in "$out/tenants-$mode"/*.detail.json; do
    python3 scripts/gpu/probes/slow_rounds.py "$detail" static tiermemd --factor 1.5 > "$out/tenants-$mode.slow.txt" 2>&1
  done
done
tar -C "$out" -cJf "$out/../window-ab.tar.xz" .
