#!/usr/bin/env bash
# The twenty-eighth session (issue 16): frees kept for a reuse planned with the cycle
# (TIERMEM_PLAN_KEPT), and an allocation that does not fit giving back only stale kept frees
# (TIERMEM_KEPT_PRESSURE=stale) or the oldest (=oldest, as before), A/B in one call: the training
# loop of `bench transparent` with PyTorch's cudaMallocAsync backend at 0.7x and 0.5x of its
# 17.5 GB peak; the backend plainly and the stock caching allocator at 0.7x beside them. The
# first run of the new defaults is traced (TIERMEM_TRACE). Everything is in OUT/ab.tar.xz.
# Usage (on the GPU machine, after scripts/gpu/build.sh here): scripts/gpu/probes/plan_kept_ab.sh OUT
set -u
out=$1
tiermem=$PWD/dist/tiermem peak=17500000000
work=$(mktemp -d)
source scripts/gpu/probes/train_lib.sh
variant() { # NAME FRACTION PLAN PRESSURE [TRACE]
    local trace=()
    [ -n "${5:-}" ] && trace=(TIERMEM_TRACE="$work/trace-$1.jsonl")
    train "$1" "" env TIERMEM_PLAN_KEPT=$3 TIERMEM_KEPT_PRESSURE=$4 "${trace[@]}" "$tiermem" run --hbm-limit $((peak * $2 / 10)) --stats --
}
export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
train async-plain "" env
variant 0.7-plan-stale-run1 7 on stale trace
variant 0.7-unplanned-oldest-run1 7 off oldest
variant 0.7-plan-stale-run2 7 on stale
variant 0.7-unplanned-oldest-run2 7 off oldest
variant 0.5-plan-stale 5 on stale
variant 0.5-unplanned-oldest 5 off oldest
unset PYTORCH_CUDA_ALLOC_CONF
train native-0.7 "" "$tiermem" run --hbm-limit $((peak * 7 / 10)) --stats --
xz -T0 "$work"/trace-*.jsonl 2>/dev/null
tar -C "$work" -cJf "$out/ab.tar.xz" .
