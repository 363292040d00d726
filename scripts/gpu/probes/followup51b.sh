#!/usr/bin/env bash
# The fifty-first session, second call: the two open issues' benchmarks at HEAD, the first
# since the forty-ninth and fiftieth sessions changed the engine: `bench tenants --repeats 3`
# (issue 13) and `bench transparent --matrix none` (issue 16; the preload does not use the
# engine's moves, so it checks that nothing else moved).
# Usage (GPU machine; dist/ built here): followup51b.sh OUT COMMIT
set -u
out=$1 commit=$2; mkdir -p "$out/results"; log=$out/summary.txt
export TIERMEM_PEERS=off
TIERMEM_COMMIT=$commit timeout 330 dist/tiermem bench tenants --repeats 3 --json "$out/results" > "$out/tenants.log" 2>&1
echo "bench tenants exit $?: $(grep -A3 '"ratios"' "$out"/results/tenants-*.json 2>/dev/null | tr -d ' \n')" | tee -a "$log"
TIERMEM_COMMIT=$commit timeout 240 dist/tiermem bench transparent --json "$out/results" --matrix none > "$out/transparent.log" 2>&1
echo "bench transparent exit $?: $(grep -A6 '"ratios"' "$out"/results/transparent-*.json 2>/dev/null | tr -d ' \n')" | tee -a "$log"
echo "=== done ($(date +%T))"
