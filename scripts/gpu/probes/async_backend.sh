#!/usr/bin/env bash
# Stream-ordered allocators under `tiermem run` (issue 16), on the GPU machine:
#   scripts/gpu/probes/async_backend.sh OUT_DIR [TIERMEM]
# 1. scripts/gpu/probes/pools.py plainly and under a 1 GiB budget (CuPy's MemoryAsyncPool on the
#    default pool, a pool of the program's own);
# 2. the training loop of `bench transparent` with PyTorch's cudaMallocAsync backend: plainly,
#    under the default budget (it fits), at 0.7x and 0.5x of its 17.5 GB peak; and with the
#    stock caching allocator at 0.7x, for comparison in the same run.
# Each run's JSON and `--stats` go to OUT_DIR.
set -u
out=${1:?OUT_DIR}
tiermem=${2:-$PWD/dist/tiermem}
mkdir -p "$out"
peak=17500000000
python3 scripts/gpu/probes/pools.py > "$out/pools-plain.json" 2> "$out/pools-plain.log"
echo "pools plain: exit $?"
"$tiermem" run --hbm-limit 1GiB --stats -- python3 scripts/gpu/probes/pools.py > "$out/pools-tiermem.json" 2> "$out/pools-tiermem.log"
echo "pools tiermem: exit $?"
train() {
    local name=$1; shift
    "$@" python3 bench/transparent_train.py --out "$out/$name.json" 2> "$out/$name.log"
    echo "$name: exit $? $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['step_s_median'], d['oom'], d['losses'][-1])" "$out/$name.json" 2>&1)"
}
export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
train async-plain env
train async-fits "$tiermem" run --stats --
train async-0.7 "$tiermem" run --hbm-limit $((peak * 7 / 10)) --stats --
train async-0.5 "$tiermem" run --hbm-limit $((peak * 5 / 10)) --stats --
unset PYTORCH_CUDA_ALLOC_CONF
train native-0.7 "$tiermem" run --hbm-limit $((peak * 7 / 10)) --stats --
