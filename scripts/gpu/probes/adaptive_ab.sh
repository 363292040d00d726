#!/usr/bin/env bash
# The twenty-eighth session's last A/B (issue 16): kept frees planned and kept from being given
# back only while the cycles are followed, the defaults, against the old behaviour
# (TIERMEM_PLAN_KEPT=off TIERMEM_KEPT_PRESSURE=oldest), with PyTorch's cudaMallocAsync backend: the
# training loop of `bench transparent` at 0.7x (twice) and 0.5x of its peak, and with its batch
# cycling 8, 4, 6, 2 at 0.7x. Everything is in OUT/adaptive.tar.xz.
# Usage (on the GPU machine, after scripts/gpu/build.sh here): scripts/gpu/probes/adaptive_ab.sh OUT
set -u
out=$1
tiermem=$PWD/dist/tiermem peak=17500000000
work=$(mktemp -d)
source scripts/gpu/probes/train_lib.sh
old=(env TIERMEM_PLAN_KEPT=off TIERMEM_KEPT_PRESSURE=oldest)
run07=("$tiermem" run --hbm-limit $((peak * 7 / 10)) --stats --)
export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
train fixed-0.7-run1 "" "${run07[@]}"
train fixed-0.7-old "" "${old[@]}" "${run07[@]}"
train varying-0.7 "--steps 12 --batches 8,4,6,2" "${run07[@]}"
train varying-0.7-old "--steps 12 --batches 8,4,6,2" "${old[@]}" "${run07[@]}"
train fixed-0.5 "" "$tiermem" run --hbm-limit $((peak * 5 / 10)) --stats --
train fixed-0.7-run2 "" "${run07[@]}"
tar -C "$work" -cJf "$out/adaptive.tar.xz" .
