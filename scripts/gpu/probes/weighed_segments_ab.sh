#!/usr/bin/env bash
# The twenty-seventh session's A/B: transparent mode's segments counted in chunks (dist/old,
# 713c5f7) against weighed in bytes (dist, this commit), on the training loop of
# `bench transparent`: PyTorch's caching allocator at 0.7x and 0.5x of its peak, and its
# cudaMallocAsync backend at 0.7x (every tensor an allocation of its own). Alternating builds.
# Usage (on the GPU machine): scripts/gpu/probes/weighed_segments_ab.sh OUT [STEPS]
set -u
out=$1 steps=${2:-8}
mkdir -p "$out"
peak=17500000000
run() {  # name build fraction [env...]
  local name=$1 build=$2 fraction=$3; shift 3
  local bin=dist/tiermem; [ "$build" = old ] && bin=dist/old/tiermem
  env "$@" timeout 150 "$bin" run --hbm-limit $((peak * fraction / 10)) --stats -- \
    python3 bench/transparent_train.py --steps "$steps" --out "$out/$name-$build.json" 2> "$out/$name-$build.log"
  echo "$name $build: exit $? $(python3 -c "
import json,sys; d=json.load(open(sys.argv[1])); print('median', round(d['step_s_median'],3), 'steps', [round(x,2) for x in d['step_s']], 'loss', d['losses'][-1])" "$out/$name-$build.json" 2>&1)"
  grep -E "segments on|all in HBM" "$out/$name-$build.log" | sed 's/^/    /'
}
TIERMEM_DAEMON=off python3 bench/transparent_train.py --steps "$steps" --out "$out/plain.json" 2> "$out/plain.log"
echo "plain: $(python3 -c "import json; d=json.load(open('$out/plain.json')); print(round(d['step_s_median'],3), d['losses'][-1])")"
for build in new old new old; do
  run native-0.7 $build 7
  run native-0.5 $build 5
  run async-0.7 $build 7 PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
done
