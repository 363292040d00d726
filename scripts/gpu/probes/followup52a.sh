#!/usr/bin/env bash
# For the session after the fifty-first: tiermem.torch's training fixes (frozen tensors and
# index buffers read in backward, BatchNorm's statistics, tiermem.strays) on the GPU for the
# first time — the Python tests on the GPU (test_torch_zoo_gpu.py's training with small modules
# unpacked hit an illegal memory access before them), then the torch benchmark (the first
# pass now runs under tiermem.strays' watch; training sites with buffers acquire for writing).
# Usage (GPU machine; dist/ built here at the commit measured, wheel included): followup52a.sh OUT COMMIT
set -u
out=$1 commit=$2; mkdir -p "$out/results"; log=$out/summary.txt
export TIERMEM_PEERS=off
python3 -m pip install -q --no-index --no-deps --force-reinstall dist/wheels/tiermem-*.whl 2>&1 | tail -2
(cd python/tests && TIERMEM_TEST_BACKEND=cuda timeout 300 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=line \
  test_torch_zoo_gpu.py test_torch.py > "$out/pytest-gpu.log" 2>&1)
echo "python GPU tests exit $?: $(tail -1 "$out/pytest-gpu.log")" | tee -a "$log"
timeout 220 python3 bench/torch_bench.py --json "$out/results" --commit "$commit" --scratch "$PWD" > "$out/torch.log" 2>&1
echo "torch exit $?: $(grep -E '"(vs_pcie_bound|tied_vs_pcie_bound|wake_vs_pcie|moe_vs_pcie_bound|moe_12_layer_vs_pcie_bound)"' "$out/torch.log" | tr -d ' \n') $(grep -E '^training' "$out/torch.log" | cut -c1-40)" | tee -a "$log"
echo "=== done ($(date +%T))"
