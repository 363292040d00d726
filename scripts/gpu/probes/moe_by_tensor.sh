#!/usr/bin/env bash
# Fused experts cut by tensor (tiermem.units) against whole blocks, on one GPU: the MoE GPU tests,
# the MoE decode with its windows swept, and with --whole-experts.
# Usage (on the GPU machine, after scripts/gpu/build.sh here): scripts/gpu/probes/moe_by_tensor.sh OUT COMMIT
set -u
out=$1 commit=$2
mkdir -p "$out/all"; log=$out/all/log.txt
python3 -m pip install -q --no-index --no-deps dist/wheels/tiermem-*.whl
echo "=== MoE GPU tests" | tee -a "$log"
TIERMEM_TEST_BACKEND=cuda timeout 120 python3 -m pytest -q python/tests/test_torch.py -k "experts or mixture" 2>&1 | tail -3 | tee -a "$log"
for arm in by-tensor whole; do
  echo "=== MoE, $arm" | tee -a "$log"
  extra=(--sweep 128,176); [ $arm = whole ] && extra=(--whole-experts --sweep 176)
  timeout 200 python3 bench/torch_bench.py --json "$out/all" --commit "$commit" --parts moe "${extra[@]}" \
    --scratch "$PWD" > "$out/all/torch-$arm.log" 2>&1
  grep -E "of the PCIe bound|identical" "$out/all/torch-$arm.log" | tail -8 | tee -a "$log"
done
cp "$out"/all/*.json "$out/"
tar -C "$out" -cJf "$out/all.tar.xz" all
