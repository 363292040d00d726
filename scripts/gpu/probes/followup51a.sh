#!/usr/bin/env bash
# The fifty-first session, first call: the first soak on the GPU since 2026-11-23 (the soak now
# discards, so zero fills hand dirty chunks' HBM over under its random timing), the engine tests
# (schedule_recorded's two-programs test many times: its flake rate, the strict build (af2c4f1) against
# the relaxed one), then `bench engine` at HEAD.
# Usage (GPU machine; dist/ built here): followup51a.sh OUT COMMIT
set -u
out=$1 commit=$2; mkdir -p "$out/results"; log=$out/summary.txt
export TIERMEM_PEERS=off
scratch=${TMPDIR:-/tmp}/tiermem-soak; mkdir -p "$scratch"
TIERMEM_COMMIT=$commit timeout 150 dist/tiermem soak --seconds 120 --threads 8 --file "$scratch/file" --json "$out/results" > "$out/soak-8.log" 2>&1
echo "soak 8 threads exit $? $(tail -1 "$out/soak-8.log")" | tee -a "$log"
timeout 80 dist/tiermem soak --seconds 45 --threads 3 --seed 7 --no-file > "$out/soak-3.log" 2>&1
echo "soak 3 threads no file exit $? $(tail -1 "$out/soak-3.log")" | tee -a "$log"
rm -rf "$scratch"
for t in handover schedule discard learned_loops; do
  TIERMEM_TEST_BACKEND=cuda timeout 120 dist/tests/$t > "$out/test-$t.log" 2>&1
  echo "test $t exit $? $(grep 'test result' "$out/test-$t.log")" | tee -a "$log"
done
for build in schedule_recorded schedule_recorded_strict; do
  fails=0
  for i in $(seq 20); do
    TIERMEM_TEST_BACKEND=cuda timeout 60 dist/tests/$build two_programs > "$out/$build-$i.log" 2>&1 || { fails=$((fails+1)); cp "$out/$build-$i.log" "$out/$build-failed-$i.log"; }
    rm -f "$out/$build-$i.log"
  done
  echo "$build two_programs: $fails of 20 failed" | tee -a "$log"
done
TIERMEM_TEST_BACKEND=cuda timeout 120 dist/tests/schedule_recorded > "$out/test-schedule_recorded.log" 2>&1
echo "test schedule_recorded exit $? $(grep 'test result' "$out/test-schedule_recorded.log")" | tee -a "$log"
TIERMEM_COMMIT=$commit timeout 120 dist/tiermem bench engine --json "$out/results" > "$out/engine.log" 2>&1
echo "bench engine exit $?: $(grep -iE 'page-in|exchange' "$out/engine.log" | tail -2 | tr '\n' ' ')" | tee -a "$log"
echo "=== done ($(date +%T))"
