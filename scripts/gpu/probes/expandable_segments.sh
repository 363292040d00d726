#!/usr/bin/env bash
# PyTorch with expandable segments (its own cuMemCreate chunks) under `tiermem run` (issue 16):
#   scripts/gpu/probes/expandable_segments.sh OUT_DIR [TIERMEM]
# The training loop of `bench transparent` (17.5 GB peak) plainly, under the default budget (it
# fits) and at 0.7x the peak, with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; and with the
# default allocator at 0.7x for comparison. Each run's JSON and `--stats` go to OUT_DIR.
set -u
out=${1:?OUT_DIR}
tiermem=${2:-$PWD/dist/tiermem}
mkdir -p "$out"
peak=17500000000
train() {
    local name=$1; shift
    "$@" python3 bench/transparent_train.py --out "$out/$name.json" 2> "$out/$name.log"
    echo "$name: exit $? $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(round(d['step_s_median'],3), d['oom'], d['losses'][-1], d['max_memory_reserved'])" "$out/$name.json" 2>&1)"
    grep -E "own VMM|HBM .* at exit" "$out/$name.log"
}
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
train expandable-plain env
train expandable-fits "$tiermem" run --stats --
train expandable-0.7 "$tiermem" run --hbm-limit $((peak * 7 / 10)) --stats --
unset PYTORCH_CUDA_ALLOC_CONF
train native-0.7 "$tiermem" run --hbm-limit $((peak * 7 / 10)) --stats --
