#!/usr/bin/env bash
# The fifty-first session, fourth call (the H200 pair): the soak over all four tiers — GPU 1
# lending its HBM to GPU 0's engine (capped, so chunks go on to the host and the file too) —
# with discards, then with borrowed chunks read in place; then `bench peer` at HEAD.
# Usage (GPU machine with two GPUs; dist/ built here): followup51d.sh OUT COMMIT
set -u
out=$1 commit=$2; mkdir -p "$out/results"; log=$out/summary.txt
scratch=${TMPDIR:-/tmp}/tiermem-soak; mkdir -p "$scratch"
nvidia-smi --query-gpu=index,name,memory.used --format=csv,noheader | tee -a "$log"
TIERMEM_COMMIT=$commit-peers TIERMEM_PEERS=auto TIERMEM_PEER_LIMIT=128MiB timeout 140 dist/tiermem soak --seconds 100 \
  --threads 8 --file "$scratch/file" --json "$out/results" > "$out/soak-peers.log" 2>&1
echo "soak peers (8 threads) exit $? $(tail -3 "$out/soak-peers.log" | head -1)" | tee -a "$log"
grep -E "^soak:|peer tier" "$out/soak-peers.log" | head -3 | tee -a "$log"
TIERMEM_PEERS=auto TIERMEM_PEER_LIMIT=128MiB TIERMEM_PEER_IN_PLACE=on timeout 90 dist/tiermem soak --seconds 60 --threads 4 --seed 5 \
  --file "$scratch/file2" > "$out/soak-peers-in-place.log" 2>&1
echo "soak peers in place (4 threads) exit $? $(tail -1 "$out/soak-peers-in-place.log")" | tee -a "$log"
grep -E "^soak:|peer tier" "$out/soak-peers-in-place.log" | head -3 | tee -a "$log"
rm -rf "$scratch"
TIERMEM_COMMIT=$commit timeout 200 dist/tiermem bench peer --json "$out/results" > "$out/peer.log" 2>&1
echo "bench peer exit $?: $(grep -A12 '"ratios"' "$out"/results/peer-*.json 2>/dev/null | tr -d ' \n')" | tee -a "$log"
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader | tee -a "$log"
echo "=== done ($(date +%T))"
