#!/usr/bin/env bash
# The thirty-sixth session (issue 16): programs of the coverage matrix on both routes of
# `tiermem run` — the driver route, then the PyTorch route (`--torch-allocator`) for the PyTorch
# programs among them — each plainly and at 2x, 0.7x, 0.5x its peak. Lists first what the
# machine has (Python packages that other programs would need), so the matrix's skips are read
# right. Results: OUT/matrix-driver.json, OUT/matrix-torch.json, OUT/*.log, OUT/have.txt.
# Usage (on the GPU machine, after scripts/gpu/build.sh here):
#   scripts/gpu/probes/matrix_routes.sh OUT DRIVER_PROGRAMS TORCH_PROGRAMS [SECONDS_EACH]
set -u
out=$1 driver=$2 torch_programs=$3 seconds=${4:-240}
tiermem=$PWD/dist/tiermem
export TIERMEM_PEERS=off
{ python3 -m pip list 2>/dev/null | grep -i -E '^(torch|jax|jaxlib|tensorflow|cupy|numba|triton|transformers|vllm|cuda-python) '
  command -v nvcc || ls /usr/local/cuda/bin/nvcc; } > "$out/have.txt" 2>&1
cat "$out/have.txt"
timeout "$seconds" python3 bench/transparent_matrix.py --tiermem "$tiermem" --out "$out/matrix-driver.json" \
    --programs "$driver" --run-args=--stats 2>&1 | tee "$out/matrix-driver.log"
[ -n "$torch_programs" ] && timeout "$seconds" python3 bench/transparent_matrix.py --tiermem "$tiermem" \
    --out "$out/matrix-torch.json" --programs "$torch_programs" --run-args="--torch-allocator --stats" 2>&1 | tee "$out/matrix-torch.log"
exit 0
