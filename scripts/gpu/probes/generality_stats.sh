#!/usr/bin/env bash
# The twenty-ninth session (issue 16): where the slow programs of generality.sh spend their time —
# each under `tiermem run --stats` at the budget given (bytes), a trace of the first.
# Usage: scripts/gpu/probes/generality_stats.sh OUT  (everything in OUT/stats.tar.xz)
set -u
out=$1
tiermem=$PWD/dist/tiermem
work=$(mktemp -d)
one() {  # NAME SCRIPT BUDGET [ENV...]
    local name=$1 script=$2 budget=$3; shift 3
    (cd bench/matrix && timeout 150 env "$@" "$tiermem" run --hbm-limit "$budget" --stats -- python3 "$script" > "$work/$name.out" 2> "$work/$name.log")
    echo "$name: exit $? $(tail -1 "$work/$name.out" | cut -c 1-40)... $(tail -1 "$work/$name.out" | grep -o '"step_s.*') $(grep -E 'all in HBM|segments on|migration on|pauses' "$work/$name.log" | sed 's/tiermem: stats: //' | tr '\n' ' ')" | tee -a "$work/summary.txt"
}
one hf_train-0.7-traced hf_train.py 15670968319 TIERMEM_TRACE="$work/hf_train-0.7.jsonl"
one hf_train-0.7-segments-off hf_train.py 15670968319 TIERMEM_SEGMENTS=off
one cnn_train-0.5 cnn_train.py 4250927104
one two_streams-0.7 two_streams.py 2254857830
one two_streams-0.7-traced two_streams.py 2254857830 TIERMEM_TRACE="$work/two_streams-0.7.jsonl"
xz -T0 "$work"/*.jsonl
tar -C "$work" -cf "$out/stats.tar" .
