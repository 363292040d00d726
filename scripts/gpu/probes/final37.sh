#!/usr/bin/env bash
# The thirty-seventh session's last GPU call (issue 16): PyTorch's memory statistics on its
# cudaMallocAsync backend plainly, under this build and under the build before pool_stats.rs
# (dist/old/) at 2x and 0.25x of their 640 MiB (scripts/gpu/probes/pool_stats.py); then the
# coverage matrix at this build, the programs most touched by this session's changes.
# Results: OUT/pool-stats.txt, OUT/matrix-final.json, OUT/matrix-final.log.
# Usage (on the GPU machine, after building dist/ here): scripts/gpu/probes/final37.sh OUT
set -u
out=$1
export TIERMEM_PEERS=off PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
probe=scripts/gpu/probes/pool_stats.py
{
    echo "plain: $(python3 $probe 2>&1 | tail -1)"
    for budget in 1342177280 167772160; do
        echo "tiermem $budget: $(dist/tiermem run --hbm-limit $budget -- python3 $probe 2>&1 | tail -1)"
        [ -x dist/old/tiermem ] && echo "before $budget: $(dist/old/tiermem run --hbm-limit $budget -- python3 $probe 2>&1 | tail -1)"
    done
} | tee "$out/pool-stats.txt"
unset PYTORCH_CUDA_ALLOC_CONF
timeout 440 python3 bench/transparent_matrix.py --tiermem "$PWD/dist/tiermem" --out "$out/matrix-final.json" \
    --programs cuda_c_static_runtime,cublas_gemm_loop,cuda_graph_replay,cupy,torch_multiprocessing,small_buffers,own_contexts,created_pool,cuda_api_tour,numba,jax_train,two_streams \
    --run-args=--stats 2>&1 | grep "matrix:" | tee "$out/matrix-final.log"
exit 0
