#!/usr/bin/env bash
# The fortieth session's third GPU call (issue 16), on one GPU: the coverage matrix's CUDA Python
# programs (cuda_python, cuda_python_ptds), then `--policy` auto / hotness / placement on a
# decoder at 0.5x and the training loop at 0.7x (policies.py). Results under OUT.
# Usage (on the GPU machine, after building dist/ here): followup40c.sh OUT
set -u
out=$1
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
export TIERMEM_PEERS=off
python3 -c "import cuda.bindings; print('cuda.bindings', cuda.bindings.__version__)" 2>&1 | tail -1
timeout 150 python3 bench/transparent_matrix.py --tiermem "$PWD/dist/tiermem" --out "$out/matrix-cuda-python.json" \
  --programs cuda_python,cuda_python_ptds --run-args=--stats 2>&1 | tail -8
timeout 400 python3 "$here/policies.py" "$PWD/dist/tiermem" "$out"
exit 0
