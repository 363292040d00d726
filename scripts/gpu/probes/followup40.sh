#!/usr/bin/env bash
# The fortieth session's GPU call (issue 16), on one GPU:
#  1. the coverage matrix's math-library programs (math_libs: cuSOLVER, cuFFT, cuSPARSE, batched
#     cuBLAS and a sort through PyTorch; cupy_libs: cuRAND, cuSOLVER, cuSPARSE, cuFFT through
#     CuPy) on the driver route, and math_libs on the PyTorch route (--torch-allocator);
#  2. host chunks made ahead of a cut (spares_ahead.sh: TIERMEM_SPARES_AHEAD off, then on), which
#     also says how fast the newcomer fills its grant (stage 2's fill, 0c97bf2).
# Results under OUT. Usage (on the GPU machine, after building dist/ here): followup40.sh OUT
set -u
out=$1
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
export TIERMEM_PEERS=off
timeout 200 python3 bench/transparent_matrix.py --tiermem "$PWD/dist/tiermem" --out "$out/matrix-libs.json" \
  --programs math_libs,cupy_libs --run-args=--stats 2>&1 | tail -12
timeout 100 python3 bench/transparent_matrix.py --tiermem "$PWD/dist/tiermem" --out "$out/matrix-libs-torch.json" \
  --programs math_libs "--run-args=--stats --torch-allocator" 2>&1 | tail -6
STEPS=40 "$here/spares_ahead.sh" "$out"
exit 0
