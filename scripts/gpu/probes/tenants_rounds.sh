#!/usr/bin/env bash
# The twenty-ninth session (issue 13): bench tenants with jobs longer than the daemon's settling
# (--rounds 20: jobs of ~2-6 s, against the ramp's 3 s) and with the old default (--rounds 5:
# 0.4-1.2 s, mostly process start-up), then the extended matrix's programs given (issue 16).
# Usage (on the GPU machine, after scripts/gpu/build.sh here):
#   scripts/gpu/probes/tenants_rounds.sh OUT COMMIT [MATRIX_PROGRAMS]
# RUNS (default "r20-1 r5-1 r20-2") names the runs: rROUNDS-LABEL.
set -u
out=$1 commit=$2 programs=${3:-}
mkdir -p "$out"; log=$out/log.txt
export TIERMEM_PEERS=off
for run in ${RUNS:-r20-1 r5-1 r20-2}; do
  rounds=${run#r}; rounds=${rounds%-*}
  echo "=== bench tenants --rounds $rounds ($run, $(date +%T))" | tee -a "$log"
  TIERMEM_COMMIT=$commit-$run timeout 330 dist/tiermem bench tenants --rounds "$rounds" --daemon-logs --json "$out/$run" > "$out/$run.log" 2>&1
  grep -E "GB/s|vs_|hog|fair|overhead|pairs|leak|reclaim|idle" "$out/$run.log" | tail -14 | tee -a "$log"
done
if [ -n "$programs" ]; then
  echo "=== matrix $programs ($(date +%T))" | tee -a "$log"
  timeout 300 python3 bench/transparent_matrix.py --tiermem "$PWD/dist/tiermem" --out "$out/matrix.json" --programs "$programs" 2>&1 | tee -a "$log"
fi
echo "=== done ($(date +%T))" | tee -a "$log"
