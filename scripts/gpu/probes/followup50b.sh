#!/usr/bin/env bash
# The fiftieth session: did hand-overs (aa03fdb..HEAD) cost the read-only decodes and the
# activations? The wheel before them (246412a, dist/wheels-before) and HEAD's (dist/wheels),
# alternated twice: the torch benchmark's tied decode and wake, 12-layer MoE and training, then
# the training profile with activations only.
# Usage (GPU machine; dist/ built here): followup50b.sh OUT COMMIT
set -u
out=$1 commit=$2; mkdir -p "$out"; log=$out/summary.txt
export TIERMEM_PEERS=off
show='import json,sys; d=json.load(open(sys.argv[1])); print(round(d["step_s"],3), {k: round(d["median"]["forward"][k],3) for k in ("s","evict_wait_ms","stall_ms")})'
for rep in 1 2; do for which in before after; do
  whl=dist/wheels/tiermem-*.whl; [ $which = before ] && whl=dist/wheels-before/tiermem-*.whl
  python3 -m pip install -q --no-index --no-deps --force-reinstall $whl 2>&1 | tail -2
  mkdir -p "$out/torch-$which-$rep"
  timeout 200 python3 bench/torch_bench.py --json "$out/torch-$which-$rep" --commit "$commit-$which" --scratch "$PWD" --parts tied,moe,training --moe-shapes 12-layer > "$out/torch-$which-$rep.log" 2>&1
  echo "torch $which $rep exit $?: $(grep -E '"(tied_vs_pcie_bound|wake_vs_pcie|moe_vs_pcie_bound)"' "$out/torch-$which-$rep.log" | tr -d ' \n') $(grep -E '^training' "$out/torch-$which-$rep.log" | cut -c1-40)" | tee -a "$log"
  timeout 150 python3 scripts/gpu/probes/train_profile.py --steps 7 --activations-only 2048 > "$out/acts-only-$which-$rep.json" 2> "$out/acts-only-$which-$rep.log"
  echo "activations only $which $rep exit $? $(python3 -c "$show" "$out/acts-only-$which-$rep.json")" | tee -a "$log"
done; done
echo "=== done ($(date +%T))"
