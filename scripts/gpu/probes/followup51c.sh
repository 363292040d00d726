#!/usr/bin/env bash
# The fifty-first session, third call: the torch benchmark at HEAD (the engine's refactors after
# af2c4f1), then the coverage matrix's six programs and four that lean on the preload's
# routing (632ebad told routed names apart by what was asked, after the last matrix at
# 8814a46): the runtime API tour, CUDA Python with per-thread default streams, Numba, contexts
# of the program's own.
# Usage (GPU machine; dist/ built here): followup51c.sh OUT COMMIT
set -u
out=$1 commit=$2; mkdir -p "$out/results"; log=$out/summary.txt
export TIERMEM_PEERS=off
python3 -m pip install -q --no-index --no-deps --force-reinstall dist/wheels/tiermem-*.whl 2>&1 | tail -2
timeout 200 python3 bench/torch_bench.py --json "$out/results" --commit "$commit" --scratch "$PWD" > "$out/torch.log" 2>&1
echo "torch exit $?: $(grep -E '"(vs_pcie_bound|tied_vs_pcie_bound|wake_vs_pcie|moe_vs_pcie_bound|moe_12_layer_vs_pcie_bound)"' "$out/torch.log" | tr -d ' \n') $(grep -E '^training' "$out/torch.log" | cut -c1-40)" | tee -a "$log"
timeout 240 python3 bench/transparent_matrix.py --tiermem "$PWD/dist/tiermem" --out "$out/results/transparent-matrix-20261130-$commit.json" > "$out/matrix.log" 2>&1
echo "matrix exit $?: $(tail -3 "$out/matrix.log" | tr '\n' ' ')" | tee -a "$log"
timeout 140 python3 bench/transparent_matrix.py --tiermem "$PWD/dist/tiermem" --out "$out/results/transparent-matrix-20261130-$commit-routing.json" \
  --programs cuda_api_tour,cuda_python_ptds,numba,own_contexts > "$out/matrix-routing.log" 2>&1
echo "matrix (routing) exit $?: $(tail -3 "$out/matrix-routing.log" | tr '\n' ' ')" | tee -a "$log"
echo "=== done ($(date +%T))"
