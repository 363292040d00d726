#!/usr/bin/env bash
# The twenty-fifth session's GPU call: the MoE block releasing the experts it has read
# (its traffic per pass against the plan's replay, the torch benchmark whole and its MoE part
# twice more), the Python tests on the GPU, and tenants at 5 and 20 rounds.
# Usage (on the GPU machine, after scripts/gpu/build.sh here): scripts/gpu/probes/moe_release.sh OUT COMMIT
set -u
out=$1 commit=$2
mkdir -p "$out"; log=$out/log.txt
python3 -m pip install -q --no-index --no-deps dist/wheels/*.whl
export TIERMEM_PEERS=off
echo "=== MoE traffic" | tee -a "$log"
timeout 120 python3 scripts/gpu/probes/moe_traffic.py "$out" > "$out/moe-traffic.txt" 2>&1
grep -E '"per_pass_vs_optimum"|sim_replay_vs_optimum' -A1 "$out/moe-traffic.txt" | head -4 | tee -a "$log"
echo "=== torch benchmark" | tee -a "$log"
timeout 240 python3 bench/torch_bench.py --json "$out/torch" --commit "$commit" --scratch "$PWD" > "$out/torch.txt" 2>&1
grep -E "of the PCIe bound|accelerate|wake:|^load|pinned|serving" "$out/torch.txt" | tail -12 | tee -a "$log"
for i in 2 3; do
  echo "=== torch benchmark, MoE part, run $i" | tee -a "$log"
  timeout 90 python3 bench/torch_bench.py --parts moe --json "$out/torch-moe-$i" --commit "$commit" > "$out/torch-moe-$i.txt" 2>&1
  grep -E "of the PCIe bound" "$out/torch-moe-$i.txt" | tee -a "$log"
done
echo "=== Python tests on the GPU" | tee -a "$log"
TIERMEM_TEST_BACKEND=cuda timeout 150 python3 -m pytest -q -rs python/tests > "$out/pytest.txt" 2>&1
tail -2 "$out/pytest.txt" | tee -a "$log"
for r in 5 20; do
  echo "=== bench tenants, throughput only, rounds $r" | tee -a "$log"
  TIERMEM_COMMIT=$commit-rounds-$r timeout 150 dist/tiermem bench tenants --json "$out/tenants-r$r" \
    --throughput-only --rounds $r 2>&1 | grep -E "GB/s|vs_" | tee -a "$log"
done
tar -C "$out" -cJf "$out/../moe-release.tar.xz" .
