#!/usr/bin/env bash
# The twenty-eighth session (issue 16): shapes that change from step to step under a budget, with
# PyTorch's cudaMallocAsync backend — the training loop of `bench transparent` with its batch
# cycling 8, 4, 6, 2 (`--batches`), plainly and at 0.7x the peak of batch 8, with kept frees given
# back stale-only (the default) or oldest-first, and with the old behaviour (not planned, oldest).
# Everything is in OUT/varying.tar.xz.
# Usage (on the GPU machine, after scripts/gpu/build.sh here): scripts/gpu/probes/varying_shapes.sh OUT
set -u
out=$1
tiermem=$PWD/dist/tiermem peak=17500000000
work=$(mktemp -d)
source scripts/gpu/probes/train_lib.sh
shapes="--steps 12 --batches 8,4,6,2"
export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
train plain "$shapes" env
train stale "$shapes" env TIERMEM_KEPT_PRESSURE=stale "$tiermem" run --hbm-limit $((peak * 7 / 10)) --stats --
train oldest "$shapes" env TIERMEM_KEPT_PRESSURE=oldest "$tiermem" run --hbm-limit $((peak * 7 / 10)) --stats --
train unplanned-oldest "$shapes" env TIERMEM_PLAN_KEPT=off TIERMEM_KEPT_PRESSURE=oldest "$tiermem" run --hbm-limit $((peak * 7 / 10)) --stats --
tar -C "$work" -cJf "$out/varying.tar.xz" .
