#!/usr/bin/env bash
# The thirty-sixth session (issue 16): how JAX's allocator settings meet `tiermem run`. XLA sizes
# its allocator from cuMemGetInfo (under tiermem: the budget), so by default it caps itself below
# the budget. Runs bench/matrix/jax_train.py plainly, then at 0.5x its peak with each setting.
# Results: OUT/jax-env.txt (one line a run), OUT/jax-*.log.
# Usage (on the GPU machine): scripts/gpu/probes/jax_env.sh OUT [SETTINGS…]
# (each setting `default` or NAME=VALUE; by default the five below; `tiermem run` points JAX at
# the pool itself since the thirty-sixth session unless a setting chooses the allocator)
set -u
out=$1 tiermem=$PWD/dist/tiermem
shift
settings=${*:-default XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_ALLOCATOR=platform XLA_PYTHON_CLIENT_MEM_FRACTION=2.0 XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async}
export TIERMEM_PEERS=off
cd bench/matrix
python3 -c "import jax, jaxlib; print('jax', jax.__version__, jax.devices())" 2>&1 | tail -1 | tee "$out/jax-env.txt"
timeout 120 python3 jax_train.py > "$out/jax-plain.out" 2> "$out/jax-plain.log"
echo "plain: exit $? $(tail -1 "$out/jax-plain.out" | cut -c1-300)" | tee -a "$out/jax-env.txt"
peak=$(python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])['peak_bytes'])" "$out/jax-plain.out")
budget=$((peak / 2))
for setting in $settings; do
    name=${setting//=/-}  # files named with '=' do not come back from the GPU machine
    started=$(date +%s%N)
    timeout 120 env $([ $setting = default ] || echo $setting) "$tiermem" run --hbm-limit $budget --stats -- \
        python3 jax_train.py > "$out/jax-$name.out" 2> "$out/jax-$name.log"
    code=$?
    echo "$setting at $budget: exit $code in $(( ($(date +%s%N) - started) / 1000000 )) ms; $(tail -1 "$out/jax-$name.out" | cut -c1-120); $(grep -v '^tiermem' "$out/jax-$name.log" | tail -1 | cut -c1-300)" | tee -a "$out/jax-env.txt"
    grep -E 'allocations|HBM .* at exit|own VMM' "$out/jax-$name.log" | tee -a "$out/jax-env.txt"
done
