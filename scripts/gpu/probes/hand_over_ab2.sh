#!/usr/bin/env bash
# The twenty-sixth session's sixth GPU call, after the hand-over kept its holder's fence and
# paced the program's thread: the engine's schedule tests on the GPU three times, bench tenants'
# throughput set with homes handed over and not (alternating, twice each), and the MoE and
# tied decodes once.
# Usage (on the GPU machine, after scripts/gpu/build.sh here): scripts/gpu/probes/hand_over_ab2.sh OUT COMMIT
set -u
out=$1 commit=$2
mkdir -p "$out"; log=$out/log.txt
python3 -m pip install -q --no-index --no-deps dist/wheels/*.whl
export TIERMEM_PEERS=off
mkdir -p /tmp/t && tar -C /tmp/t -xJf dist/tests.tar.xz
for i in 1 2 3; do
  echo "=== engine schedule tests on the GPU, run $i" | tee -a "$log"
  TIERMEM_TEST_BACKEND=cuda timeout 60 /tmp/t/tests/engine-schedule > "$out/schedule-$i.txt" 2>&1
  grep -E "test result|panicked|page-ins|look_past" "$out/schedule-$i.txt" | tee -a "$log"
done
for i in 1 2; do
  for h in off on; do
    echo "=== bench tenants throughput, hand over $h, run $i" | tee -a "$log"
    TIERMEM_HAND_OVER=$h TIERMEM_COMMIT=$commit-$h timeout 100 dist/tiermem bench tenants --json "$out/tenants-$h-$i" --throughput-only 2>&1 | grep -E "GB/s" | tee -a "$log"
  done
done
echo "=== torch benchmark, MoE and tied" | tee -a "$log"
timeout 200 python3 bench/torch_bench.py --parts moe,tied --json "$out/torch" --commit "$commit" --scratch "$PWD" > "$out/torch.txt" 2>&1
grep -E "of the PCIe bound|wake:|^load" "$out/torch.txt" | tee -a "$log"
tar -C "$out" -cJf "$out/../hand-over-ab2.tar.xz" .
