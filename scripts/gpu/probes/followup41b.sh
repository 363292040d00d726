#!/usr/bin/env bash
# The forty-first session's second call, on the H200 pair (issues 13, 16):
#  1. the daemon leasing neighbours' HBM to transparent programs with the thirty-ninth session's
#     staging (f5c4025: A's peer budget kept at its share while B's HBM grant is staged; 0c97bf2:
#     B fills its grant through stage 2) — followup39.sh's pair part, not run on a pair since;
#  2. the fortieth session's matrix programs (CUDA's math libraries through PyTorch and CuPy, CUDA
#     Python with and without per-thread streams) with a neighbour lending its HBM (--peers auto).
# Results under OUT. Usage (on the GPU machine, after building dist/ here): followup41b.sh OUT
set -u
out=$1
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
PEER_POOL=6GiB HBM_POOL=12GiB A_FULL_GIB=11 STEPS=40 TIERMEM_PEERS=off timeout 220 \
  "$here/daemon_transparent.sh" "$PWD/dist/tiermem" "$out/pair" > "$out/pair.log" 2>&1
echo "pair: exit $?"
python3 "$here/lease_summary.py" "$out/pair/summary.json" pair
unset TIERMEM_PEERS
timeout 300 python3 bench/transparent_matrix.py --tiermem "$PWD/dist/tiermem" --out "$out/matrix-peers-libs.json" \
  --programs math_libs,cupy_libs,cuda_python,cuda_python_ptds "--run-args=--stats --peers auto" 2>&1 | tail -14
exit 0
