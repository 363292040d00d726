#!/usr/bin/env bash
# The fifty-first session, fifth call: `bench tenants`' throughput sets with less host work
# between each job's kernels than the benchmark's 2 ms per 128 MiB buffer (0 and 0.5 ms): how
# far the daemon's gain over static caps depends on the jobs being link-bound (issue 13).
# Usage (GPU machine; dist/ built here): followup51e.sh OUT COMMIT
set -u
out=$1 commit=$2; mkdir -p "$out"; log=$out/summary.txt
export TIERMEM_PEERS=off
for think in 0 0.5; do
  mkdir -p "$out/think-$think"
  TIERMEM_COMMIT=$commit timeout 200 dist/tiermem bench tenants --throughput-only --repeats 3 --think-ms $think \
    --json "$out/think-$think" > "$out/think-$think.log" 2>&1
  echo "think $think exit $?: $(python3 -c "
import json,glob
d=json.load(open(glob.glob('$out/think-$think/tenants-*[0-9a-f].json')[0]))
m=d['metrics']; print({k: round(v,3) for k,v in {**d['ratios'], **{x: m[x] for x in m if x.startswith('throughput_')}}.items() if v is not None})
" 2>&1)" | tee -a "$log"
done
echo "=== done ($(date +%T))"
