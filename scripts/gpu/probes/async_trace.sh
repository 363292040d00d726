#!/usr/bin/env bash
# The twenty-seventh session: why PyTorch's cudaMallocAsync backend under `tiermem run` at 0.7x
# of its peak follows none of its cycles. The training loop of `bench transparent` with the
# backend, traced (TIERMEM_TRACE), then the engine's schedule tests on the GPU.
# Usage (on the GPU machine, after scripts/gpu/build.sh here): scripts/gpu/probes/async_trace.sh OUT [STEPS]
set -u
out=$1 steps=${2:-6}
mkdir -p "$out"
peak=17500000000
PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync TIERMEM_TRACE="$out/trace-async-0.7.jsonl" \
  timeout 200 dist/tiermem run --hbm-limit $((peak * 7 / 10)) --stats -- \
  python3 bench/transparent_train.py --steps "$steps" --out "$out/async-0.7.json" 2> "$out/async-0.7.log"
echo "async 0.7: exit $? $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['step_s'])" "$out/async-0.7.json" 2>&1)"
grep "stats" "$out/async-0.7.log"
xz -T0 "$out/trace-async-0.7.jsonl"
mkdir -p /tmp/t && tar -C /tmp/t -xJf dist/tests.tar.xz
for i in 1 2; do
  TIERMEM_TEST_BACKEND=cuda timeout 120 /tmp/t/tests/engine-schedule > "$out/engine-schedule-$i.txt" 2>&1
  echo "engine-schedule run $i: $(grep -E "test result" "$out/engine-schedule-$i.txt" | tail -1)"
  grep -E "^test .* FAILED|panicked at" -A1 "$out/engine-schedule-$i.txt" | head -6
done
